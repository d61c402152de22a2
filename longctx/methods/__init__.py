"""One sub-package per method: its pure-PyTorch network, its LightningModule on `LMBase`, its memory
type, FLOPs count and figures (see docs/architecture.md, "Adding a method")."""

"""Adaptive Attention Span (Sukhbaatar et al. 2019): `network` (pure PyTorch), `module` (LightningModule)."""

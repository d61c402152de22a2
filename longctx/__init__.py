"""longctx: long-context language modeling experiments on PyTorch Lightning.

Adaptive Attention Span (Sukhbaatar et al. 2019), Transformer-XL + TRAMS (Dai et al. 2019; Yu et al.
2023) and recurrence for pretrained transformers (Yoshida et al. 2020) on one data pipeline and one
CLI. See README.md and docs/architecture.md.
"""

__version__ = "0.1.0"

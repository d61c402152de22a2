"""Transformer-XL (Dai et al. 2019), Transformer+RPE and TRAMS (Yu et al. 2023): `network`, `module`."""

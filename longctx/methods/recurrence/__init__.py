"""Recurrence for pretrained transformers (Yoshida et al. 2020) on GPT-2: `network`, `module`."""

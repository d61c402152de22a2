"""Recurrence for pretrained transformers (Yoshida et al. 2020) on GPT-2: `network`, `module`; `hf`
holds everything longctx uses of Hugging Face `transformers`."""

"""The llmsuite engine: GGUF models, tokenizers, memory, contexts and sampling on NumPy."""

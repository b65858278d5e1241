"""Pretraining: the plain-PyTorch step and loop, the input prefetch, the domain phase, the Ray Train driver,
the model store (ids, folders, finished markers) and the Hugging Face export (with its modeling file in hf/)."""

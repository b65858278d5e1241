"""The encoder every stage shares: the model and its heads, the tokenizer, the objective interface (registry) and the batches it reads."""

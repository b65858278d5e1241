"""The corpus stage: documents from the sources, minus the held-out task texts, tokenized (the tokenizer trained
here), cut into chunks, labelled by the objectives and written as parquet shards with Ray Data."""

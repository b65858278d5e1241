"""Data: the pretraining corpus and its sources (Wikipedia dumps, text files, the bundled summaries in
corpus_data/), the tokenizer, document ids, and the content holdout that keeps task text out of every corpus."""

"""FEL (few-example learning): finetuning a pretrained model on a task's few examples, the protocol's splits
and baselines, scoring, trial files and serving a finetuned model."""

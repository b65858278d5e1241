"""FEL (few-example learning): finetuning a pretrained model on a task's few examples, the protocol's
calculations, the task kinds and task files, scoring, trial files and serving a finetuned model."""

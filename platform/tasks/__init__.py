"""The first stage: the finetuning task interface, the generic declared kinds, task files, the task data and the held-out texts every corpus excludes."""

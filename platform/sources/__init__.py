"""Documents from their sources (the bundled summaries, wiki dumps, text files) and the text rules shared by task data and corpus labels."""

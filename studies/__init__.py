"""The study scripts, one per question (`python studies/NAME.py` is what `ray job submit` runs), importable as
`alignlab.studies` so that `alignlab study NAME [flags]` runs the same entry, `main(argv, prog)`, with the same
flags. A module's first docstring line is its line in `alignlab study --help`."""

"""Make the worked example of docs/your_task.md: a small BIO-tagged token-tagging set from PyPI package summaries.

Source: platform/sources/corpus_data/software_summaries.txt (PyPI package summaries shipped with alignlab; one
`name<TAB>summary` a line). Labels: silver, not hand-made -- each summary word sequence matching an entry of
the lists below is tagged B-/I-LANG (a programming or markup language) or B-/I-TECH (a framework, service or
tool); case-insensitive, trailing punctuation ignored; everything else is O. A summary is kept when it has 4 to
25 words; 400 with at least one entity and 100 without, drawn with a fixed seed; the first 400 are the pool
(the mini preset's budget of 200 is sampled from it), the other 100 the test set. Rerun to rebuild the two files bit for bit:

    python examples/software_ner/make_dataset.py
"""
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / "platform" / "data" / "corpus_data" / "software_summaries.txt"
LANG = ["python", "javascript", "typescript", "rust", "java", "c++", "c#", "ruby", "php", "perl", "haskell",
        "scala", "kotlin", "julia", "lua", "fortran", "cython", "sql", "html", "css", "markdown", "latex", "yaml",
        "json", "toml", "xml", "bash", "golang", "matlab", "elixir", "erlang", "ocaml", "clojure", "swift"]
TECH = ["django", "flask", "fastapi", "pytest", "numpy", "pandas", "pytorch", "tensorflow", "keras", "jupyter",
        "docker", "kubernetes", "aws", "amazon web services", "google cloud", "azure", "github", "gitlab", "redis",
        "postgresql", "mysql", "sqlite", "mongodb", "elasticsearch", "kafka", "rabbitmq", "celery", "sqlalchemy",
        "graphql", "openai", "slack", "telegram", "discord", "home assistant", "robot framework", "ansible",
        "terraform", "airflow", "spark", "apache spark", "hadoop", "react", "vue", "selenium", "scikit-learn",
        "matplotlib", "plotly", "streamlit", "sphinx", "git", "linux", "windows", "macos", "android", "ios",
        "raspberry pi", "arduino", "opencv", "hugging face", "langchain", "odoo", "pydantic", "grpc", "s3"]
ENTITIES = sorted(((tuple(e.split()), "LANG") for e in LANG), key=lambda x: -len(x[0])) + \
    sorted(((tuple(e.split()), "TECH") for e in TECH), key=lambda x: -len(x[0]))
ENTITIES.sort(key=lambda x: -len(x[0]))  # longest match first


def norm(word: str) -> str:
    return word.lower().rstrip(".,;:!?)").lstrip("(")


def tag(tokens: list[str]) -> list[str]:
    words, tags, i = [norm(t) for t in tokens], ["O"] * len(tokens), 0
    while i < len(words):
        for ent, typ in ENTITIES:
            if tuple(words[i: i + len(ent)]) == ent:
                tags[i: i + len(ent)] = [f"B-{typ}"] + [f"I-{typ}"] * (len(ent) - 1)
                i += len(ent)
                break
        else:
            i += 1
    return tags


def main() -> None:
    with_ent, without, seen = [], [], set()
    for line in SOURCE.read_text(encoding="utf-8").splitlines():
        _, _, summary = line.partition("\t")
        tokens = summary.split()
        if not 4 <= len(tokens) <= 25 or tuple(tokens) in seen:
            continue
        seen.add(tuple(tokens))
        tags = tag(tokens)
        (with_ent if any(t != "O" for t in tags) else without).append({"tokens": tokens, "tags": tags})
    rng = random.Random(44)
    examples = rng.sample(with_ent, 400) + rng.sample(without, 100)
    rng.shuffle(examples)
    for name, part in (("pool.jsonl", examples[:400]), ("test.jsonl", examples[400:])):
        with open(HERE / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(ex, ensure_ascii=False) + "\n" for ex in part)
        print(f"{HERE / name}: {len(part)} examples")


if __name__ == "__main__":
    main()

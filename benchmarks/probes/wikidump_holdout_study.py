"""A smoke study on a Wikipedia dump, and what the content holdout kept out of its corpus.

The AD test snippets are cut from Wikipedia article leads, and a dump's documents are `wikidump:{page_id}`, not
the bundled ids the old holdout matched: before the content rule, a dump-based corpus kept the test snippets and
the sentences that define their acronyms. This writes a small MediaWiki dump whose pages are the bundled English
summaries (so it holds exactly those leads, under dump ids), runs the objective-ablation study on it at the
`smoke` preset, and prints the holdout record of the study's corpus manifest: the rule, and the documents removed
per source and reason.

    python benchmarks/probes/wikidump_holdout_study.py --storage /tmp/wikidump-study [--docs 600]
"""
from __future__ import annotations

import argparse
import bz2
import json
import subprocess
import sys
from pathlib import Path
from xml.sax.saxutils import escape

from alignlab.platform.sources.sources import read_bundled

REPO = Path(__file__).resolve().parents[2]


def write_dump(path: Path, num_docs: int) -> int:
    pages = []
    for i, doc in enumerate(read_bundled(("en",), max_docs_per_lang=num_docs)):
        pages.append(f"  <page>\n    <title>{escape(doc.title)}</title>\n    <ns>0</ns>\n    <id>{i + 1}</id>\n"
                     f"    <revision>\n      <id>{i + 100001}</id>\n"
                     f'      <text xml:space="preserve">{escape(doc.text)}</text>\n    </revision>\n  </page>\n')
    xml = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11" xml:lang="en">\n'
           '  <siteinfo>\n    <sitename>Wikipedia</sitename>\n    <namespaces>\n'
           '      <namespace key="0" case="first-letter" />\n    </namespaces>\n  </siteinfo>\n'
           + "".join(pages) + "</mediawiki>\n")
    path.write_bytes(bz2.compress(xml.encode("utf-8")))
    return len(pages)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--storage", type=Path, required=True)
    ap.add_argument("--docs", type=int, default=600, help="bundled English summaries written into the dump")
    args = ap.parse_args()
    args.storage.mkdir(parents=True, exist_ok=True)
    dump = args.storage / "enwiki-sample-pages-articles.xml.bz2"
    n = write_dump(dump, args.docs)
    print(f"dump: {dump} ({n} pages, the bundled English summaries under dump ids)", flush=True)
    cmd = [sys.executable, str(REPO / "studies" / "objective_ablation.py"), "--preset", "smoke",
           "--storage", str(args.storage), "--source", "wikidump", "--path", str(dump), "--lang", "en",
           "--allow-smaller-vocab"]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    study = json.loads(next((args.storage / "studies").glob("*/study.json")).read_text())
    manifest = json.loads((Path(study["corpus_dir"]) / "manifest.json").read_text())
    print(f"corpus {manifest.get('corpus_id')}: holdout record of its manifest")
    print(json.dumps(manifest["holdout"], indent=1))


if __name__ == "__main__":
    main()

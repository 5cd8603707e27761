"""Measures retrieval by chunk size, to choose ingest.chunking's DEFAULT_PARSER_CONFIG.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/chunk_size.py [--sizes 64,96,128,160,192,254,512]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/chunk_size.py --compare-query-encoders [--sizes 192]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/chunk_size.py --compare-backends [--sizes 192]

Corpus: the demo documents of ``examples/`` (PDF and DOCX made by ``scripts/make_samples.py``)
and the licence texts in /usr/share/common-licenses as distractors. Each question has a known
answer: a key phrase found in one place of one document. A returned chunk is a hit when it
holds the key phrase (whitespace normalised). A second, harder set asks about the licences
themselves: long, similar legal texts. Reports recall@1/3/5, MRR over the top 10, and
hit rate when the retrieved context is capped at 640 tokens (k = 640 // size): what a
reader with a fixed prompt budget gets. Same parsers, chunker, model and ranking (``top_k``)
as the executor and ``ingest search``.

``--compare-query-encoders`` encodes the questions both ways a search can (sentence-transformers
with torch, and the model's ONNX export: ``ingest.query_encoder``, made first if missing) and
prints R@1 and MRR side by side, over the same chunk vectors; they must be equal (exit 1 if not).

``--compare-backends`` lets each ``INGEST_EMBEDDING_BACKEND`` (torch, onnx, onnx-int8) embed both
the chunks and the questions, as a knowledge base it made would be searched, and prints R@1,
R@3, MRR, its encode rate and the cosine of its chunk vectors against torch's.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from db.config import Settings  # noqa: E402
from ingest.chunking import ChunkConfig, chunk_document  # noqa: E402
from ingest.embedding import load_embedder  # noqa: E402
from ingest.parsers import parse_document  # noqa: E402
from ingest.search import top_k  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LICENCES = Path("/usr/share/common-licenses")
CONTEXT_BUDGET = 640
DEMO_DOCUMENTS = (
    "beekeeping.md",
    "bicycle_maintenance.pdf",
    "chess_openings.md",
    "coffee.html",
    "composting.txt",
    "knots.json",
    "lighthouses.md",
    "orbital_mechanics.md",
    "origami_basics.docx",
    "railway_milestones.csv",
    "sourdough.txt",
    "tides.txt",
    "volcanoes.html",
)

QUESTIONS: list[tuple[str, str, str]] = [  # (question, document, key phrase of the answer)
    (
        "How do honeybees tell each other how far away the flowers are?",
        "beekeeping.md",
        "one second of waggling",
    ),
    ("Which parasite is the biggest threat to managed bee colonies?", "beekeeping.md", "Varroa destructor"),
    ("How long does a worker bee live in summer?", "beekeeping.md", "about six weeks"),
    ("How do scout bees choose a new home for a swarm?", "beekeeping.md", "quorum of about fifteen scouts"),
    ("How much honey does a colony need to survive the winter?", "beekeeping.md", "20 to 25 kilograms"),
    ("What is an autolyse in bread making?", "sourdough.txt", "left to rest for thirty"),
    ("How long does bulk fermentation of sourdough take?", "sourdough.txt", "four to six hours"),
    (
        "What does the hydration of a dough mean?",
        "sourdough.txt",
        "weight of water divided by the weight of flour",
    ),
    ("Why do bakers score a loaf before baking?", "sourdough.txt", "controls where the loaf opens"),
    ("How do I start a sourdough starter from scratch?", "sourdough.txt", "equal weights of whole rye"),
    ("What scale measures the size of volcanic eruptions?", "volcanoes.html", "Volcanic Explosivity Index"),
    ("Which eruption caused the year without a summer?", "volcanoes.html", "Tambora"),
    ("What is the deadliest volcanic hazard?", "volcanoes.html", "pyroclastic flow:"),
    (
        "How do scientists tell that a volcano is about to erupt?",
        "volcanoes.html",
        "swarms of small earthquakes",
    ),
    ("Who invented the lens used in lighthouses?", "lighthouses.md", "Augustin-Jean"),
    ("How do sailors know which lighthouse they are looking at?", "lighthouses.md", "time the flashes"),
    ("When did the last lighthouse keepers leave in the UK?", "lighthouses.md", "North Foreland"),
    ("What was the Pharos of Alexandria?", "lighthouses.md", "Seven Wonders"),
    ("Where is the largest tidal range in the world?", "tides.txt", "Bay of Fundy"),
    ("What are neap tides?", "tides.txt", "smallest range"),
    ("Which tidal power station opened in France in 1966?", "tides.txt", "La Rance"),
    ("Why is high tide later every day?", "tides.txt", "fifty minutes later"),
    ("What principles make a good chess opening?", "chess_openings.md", "control the centre squares"),
    ("Which Sicilian line did Fischer and Kasparov like?", "chess_openings.md", "Najdorf"),
    ("Is the Queen's Gambit a real gambit?", "chess_openings.md", "not a true gambit"),
    ("How are chess openings classified?", "chess_openings.md", "ECO codes"),
    ("How much caffeine does robusta have compared with arabica?", "coffee.html", "twice as much"),
    ("At what temperature does first crack happen in a coffee roast?", "coffee.html", "196 degrees"),
    ("What pressure is used to brew espresso?", "coffee.html", "9 bar"),
    ("Why does my espresso taste sour?", "coffee.html", "under-extracted"),
    ("What carbon to nitrogen ratio is best for compost?", "composting.txt", "30 to 1"),
    ("How hot does a hot compost pile get?", "composting.txt", "55 to 65 degrees"),
    ("Which worms are used for worm composting?", "composting.txt", "Eisenia fetida"),
    ("What should not go into a home compost heap?", "composting.txt", "attract rats"),
    ("What is the escape velocity of the Earth?", "orbital_mechanics.md", "11.2 kilometres per second"),
    (
        "What is the most fuel-efficient way to move between two orbits?",
        "orbital_mechanics.md",
        "Hohmann transfer,",
    ),
    ("How high above the equator is a geostationary orbit?", "orbital_mechanics.md", "35,786"),
    ("Where does the James Webb Space Telescope orbit?", "orbital_mechanics.md", "L2 point"),
    ("What are Kepler's laws of planetary motion?", "orbital_mechanics.md", "orbits are ellipses"),
    ("When was the first transcontinental railroad completed?", "railway_milestones.csv", "golden spike"),
    ("What is the speed record for a steam locomotive?", "railway_milestones.csv", "Mallard"),
    ("When did the first high-speed bullet train open?", "railway_milestones.csv", "Tokaido Shinkansen"),
    ("Which knot joins two ropes of different thickness?", "knots.json", "Sheet bend"),
    (
        "What knot do climbers use to tie into a harness?",
        "knots.json",
        "standard knot for tying a climbing rope",
    ),
    ("Why shouldn't a reef knot join two ropes under load?", "knots.json", "capsize"),
    ("What tyre pressure should a mountain bike use?", "bicycle_maintenance.pdf", "25 to 35 psi"),
    ("When should I replace a bicycle chain?", "bicycle_maintenance.pdf", "0.5 percent on bikes"),
    ("What causes a pinch flat?", "bicycle_maintenance.pdf", "squeezed against the rim"),
    ("How do I fix a spongy hydraulic brake lever?", "bicycle_maintenance.pdf", "bleeding the brake"),
    ("Who created the notation used in origami diagrams?", "origami_basics.docx", "Akira Yoshizawa"),
    ("What is a senbazuru?", "origami_basics.docx", "thousand paper cranes"),
    ("What has the Miura fold been used for?", "origami_basics.docx", "solar panel array"),
]


# Harder: long, similar legal texts. Key phrases may recur in a sibling version of a licence
# (GPL-2 and GPL-3, GFDL-1.2 and 1.3); a passage holding the phrase answers the question.
LICENCE_QUESTIONS: list[tuple[str, str, str]] = [
    ("Under the Apache License, what happens to my patent licence if I sue someone claiming the work infringes a patent?", "licence:Apache-2.0", "shall terminate as of the date such litigation is filed"),
    ("Do I have to mark files I changed when redistributing Apache-licensed code?", "licence:Apache-2.0", "modified files to carry prominent notices"),
    ("What must I do with the NOTICE text file when I redistribute an Apache-licensed work?", "licence:Apache-2.0", "readable copy of the attribution notices"),
    ("How long must a written offer of source code stay valid?", "licence:GPL-3", "valid for at least three years"),
    ("Can I sublicense software under the GPL version 3?", "licence:GPL-3", "sublicensing is not allowed"),
    ("Does GPL software count as an effective technological measure under anti-circumvention laws?", "licence:GPL-3", "protecting users' legal rights from anti-circumvention law"),
    ("How are my rights reinstated after I stop violating the licence?", "licence:GPL-3", "copyright holder is reinstated"),
    ("What must be given to users of consumer products so they can install modified software?", "licence:GPL-3", "installation information"),
    ("Does the GPL cover activities other than copying, distribution and modification?", "licence:GPL-2", "not covered by this license; they are outside its scope"),
    ("Why would a library use the Lesser GPL to permit linking into non-free programs?", "licence:LGPL-2.1", "permit linking those libraries into non-free programs"),
    ("What is the Minimal Corresponding Source under the LGPL version 3?", "licence:LGPL-3", "minimal corresponding source"),
    ("What does Incompatible With Secondary Licenses mean in the MPL 2.0?", "licence:MPL-2.0", "incompatible with secondary licenses"),
    ("Which court has jurisdiction over disputes under the Mozilla Public License 2.0?", "licence:MPL-2.0", "where the defendant maintains its principal place of business"),
    ("What must go in the LEGAL file under the Mozilla Public License 1.1?", "licence:MPL-1.1", "legal file"),
    ("Does CC0 waive trademark or patent rights?", "licence:CC0-1.0", "no trademark or patent rights held by affirmer"),
    ("What happens if the CC0 waiver is judged invalid?", "licence:CC0-1.0", "public license fallback"),
    ("What is the Standard Version of a package under the Artistic License?", "licence:Artistic", '"standard version" refers to'),
    ("Can I charge money for copying a package under the Artistic License?", "licence:Artistic", "reasonable copying fee"),
    ("Can I use the University's name to promote products derived from BSD-licensed software?", "licence:BSD", "may be used to endorse or promote"),
    ("How many words may a Back-Cover Text have in the GNU Free Documentation License?", "licence:GFDL-1.3", "up to 25 words"),
    ("What are Invariant Sections in the GNU Free Documentation License?", "licence:GFDL-1.3", 'the "invariant sections" are certain secondary sections'),
    ("What is a Transparent copy of a document under the GFDL?", "licence:GFDL-1.3", 'a "transparent" copy of the document means'),
    ("What is a Massive Multiauthor Collaboration Site?", "licence:GFDL-1.3", "massive multiauthor collaboration site"),
    ("Can I charge a fee for conveying copies of GPL software?","licence:GPL-3","you may charge any price or no price for each copy that you convey"),
    ("When is a compilation of separate works called an aggregate?","licence:GPL-3",'is called an "aggregate"'),
    ("Can I convey object code using peer-to-peer transmission?","licence:GPL-3","peer-to-peer transmission"),
    ("Do I have to accept the GPL just to receive or run a copy of a program?","licence:GPL-3","you are not required to accept this license in order to receive or run a copy"),
    ("What are the System Libraries of an executable work?","licence:GPL-3",'the "system libraries" of an executable work'),
    ("What does it mean to propagate a work?","licence:GPL-3",'to "propagate" a work means'),
    ("May I combine GPL code with code under the GNU Affero General Public License?","licence:GPL-3","use with the gnu affero general public license"),
    ("Does the Apache License let me use the licensor's trademarks?","licence:Apache-2.0","does not grant permission to use the trade names"),
    ("Can I offer warranty or support for a fee for Apache-licensed software?","licence:Apache-2.0","accepting warranty or additional liability"),
    ("Are contributions I submit to an Apache project covered by the license?","licence:Apache-2.0","submission of contributions"),
    ("Do separable works that just link to an Apache-licensed work count as Derivative Works?","licence:Apache-2.0","shall not include works that remain separable from"),
    ("What is Covered Software under the MPL 2.0?","licence:MPL-2.0",'"covered software" means'),
    ("Can I distribute MPL-licensed code as an executable?","licence:MPL-2.0","distribution of executable form"),
    ("What notice must be attached to source files under the MPL 2.0?","licence:MPL-2.0","exhibit a - source code form license notice"),
    ("What happens if I start patent litigation over MPL 2.0 software?","licence:MPL-2.0","if you initiate litigation against any entity by asserting a patent infringement claim"),
    ("What are Cover Texts in the GNU Free Documentation License?","licence:GFDL-1.3",'the "cover texts" are certain short passages of text'),
    ("When must I provide transparent copies of a document I publish in large numbers?","licence:GFDL-1.3","numbering more than 100"),
    ("What does a section Entitled XYZ mean?","licence:GFDL-1.3",'section "entitled xyz" means'),
    ("How do I apply the GNU Free Documentation License to my own document?","licence:GFDL-1.3","addendum: how to use this license for your documents"),
    ("What is an Application under the LGPL version 3?","licence:LGPL-3",'an "application" is any work that makes use of an interface'),
    ("Can object code use material from an LGPL library's header files?","licence:LGPL-3","object code incorporating material from library header files"),
    ("What is the Linked Version in the LGPL 3?","licence:LGPL-3",'the "linked version"'),
    ("Can I include an Artistic-licensed package in a commercial distribution?","licence:Artistic","aggregation of this package with a commercial distribution is always"),
    ("What does Freely Available mean in the Artistic License?","licence:Artistic",'"freely available" means'),
    ("What is the purpose of the CC0 dedication?","licence:CC0-1.0","statement of purpose"),
    ("Does the CC0 affirmer give any warranty?","licence:CC0-1.0","offers the work as-is"),
    ("Is BSD software provided with any warranty by the Regents?","licence:BSD","provided by the regents and contributors"),
    ("Can I switch LGPL-licensed code to the ordinary GPL?","licence:LGPL-2.1","you may opt to apply the terms of the ordinary gnu general public license"),
    ("How long must source code of modifications stay available under MPL 1.1?","licence:MPL-1.1","twelve (12) months"),
    ("Is the output of a GPL program covered by the GPL version 2?","licence:GPL-2","the output from the program is covered only if its contents constitute a work based on the program"),
]  # fmt: skip


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).lower()


def corpus() -> list[tuple[str, bytes, str]]:
    """``(name, bytes, doc_type)`` of the demo documents and the licence distractors."""
    docs = []
    for name in DEMO_DOCUMENTS:
        docs.append((name, (EXAMPLES / name).read_bytes(), name.rsplit(".", 1)[1]))
    if LICENCES.is_dir():
        for path in sorted(LICENCES.iterdir()):
            if path.is_file() and not path.is_symlink():
                docs.append((f"licence:{path.name}", path.read_bytes(), ""))
    return docs


def measure(
    size: int,
    docs: list[tuple[str, bytes, str]],
    model: str,
    question_sets: dict[str, tuple[list, object]],
    encoder: Any = None,
    out: dict[str, Any] | None = None,
) -> dict[str, dict[str, float]]:
    """Retrieval figures at chunk ``size``; the chunks embedded by ``encoder`` (default torch),
    their vectors left in ``out["vectors"]`` when given."""
    config = ChunkConfig.from_parser_configs({"chunk_token_num": size, "overlap_percent": 10})
    names, texts = [], []
    for name, data, doc_type in docs:
        for chunk in chunk_document(parse_document(data, doc_type), config, model):
            names.append(name)
            texts.append(chunk.content)
    started = time.monotonic()
    vectors = (encoder or load_embedder(model)).encode(texts, 32)
    encode_s = time.monotonic() - started
    if out is not None:
        out["vectors"] = vectors
    ids = [str(i) for i in range(len(texts))]
    normed = [_norm(t) for t in texts]
    budget_k = max(1, CONTEXT_BUDGET // size)
    results = {}
    for set_name, (questions, query_vectors) in question_sets.items():
        at1 = at3 = at5 = budget = rr = 0.0
        for (_, _, phrase), query in zip(questions, query_vectors, strict=True):
            ranked = [int(i) for i, _ in top_k([(ids, vectors)], query, max(10, budget_k))]
            hits = [_norm(phrase) in normed[i] for i in ranked]
            first = hits.index(True) + 1 if True in hits else 0
            at1 += first == 1
            at3 += 0 < first <= 3
            at5 += 0 < first <= 5
            budget += 0 < first <= budget_k
            rr += 1 / first if first else 0
        n = len(questions)
        results[set_name] = {
            "size": size,
            "chunks": len(texts),
            "recall@1": at1 / n,
            "recall@3": at3 / n,
            "recall@5": at5 / n,
            "mrr@10": rr / n,
            "budget_k": budget_k,
            "hit@budget": budget / n,
            "encode_s": encode_s,
        }
    return results


def compare_query_encoders(sizes: list[int]) -> int:
    """R@1 and MRR with the questions encoded through torch and through ONNX, side by side."""
    from ingest.model_export import export_model
    from ingest.query_encoder import query_encoder

    settings = Settings.from_env(os.environ)
    export = export_model(settings)  # "present" when it is there already
    print(f"ONNX export: {export.state} in {export.export_dir}")
    encoders = {"torch": load_embedder(settings.embedding_model)}
    encoders["onnx"] = query_encoder(settings.replace(query_encoder="onnx"))
    sets = {"demo": QUESTIONS, "licences": LICENCE_QUESTIONS, "all": QUESTIONS + LICENCE_QUESTIONS}
    question_sets = {
        f"{name}/{way}": (qs, encoder.encode([q for q, _, _ in qs]))
        for name, qs in sets.items()
        for way, encoder in encoders.items()
    }
    docs = corpus()
    print(f"{len(docs)} documents, model {encoders['torch'].identity}, overlap 10 %\n")
    print(
        f"{'size':>5} {'set':>9} {'R@1 torch':>9} {'R@1 onnx':>9} {'MRR torch':>9} {'MRR onnx':>9} {'equal':>6}"
    )
    equal = True
    for size in sizes:
        row = measure(size, docs, settings.embedding_model, question_sets)
        for name in sets:
            t, o = row[f"{name}/torch"], row[f"{name}/onnx"]
            same = all(t[m] == o[m] for m in ("recall@1", "recall@3", "recall@5", "mrr@10", "hit@budget"))
            equal = equal and same
            print(
                f"{size:>5} {name:>9} {t['recall@1']:>9.3f} {o['recall@1']:>9.3f} {t['mrr@10']:>9.3f} "
                f"{o['mrr@10']:>9.3f} {'yes' if same else 'NO':>6}"
            )
    return 0 if equal else 1


def compare_backends(sizes: list[int]) -> int:
    """INGEST_EMBEDDING_BACKEND side by side: each backend embeds the chunks and the questions
    itself (as a knowledge base it made would be searched); R@1, MRR, chunks/s, and the cosine
    of its chunk vectors with torch's. Exit 1 where onnx is not torch's equal, or int8 loses
    more than 0.02 of R@1 or MRR on a set."""
    import numpy as np

    from ingest.model_export import export_int8
    from ingest.query_encoder import backend_encoder

    settings = Settings.from_env(os.environ)
    made = export_int8(settings)  # the fp32 export first, then its quantization ("present" if there)
    print(f"exports: {made.state} in {made.export_dir}")
    backends = ("torch", "onnx", "onnx-int8")
    encoders = {b: backend_encoder(settings.replace(embedding_backend=b)) for b in backends}
    sets = {"demo": QUESTIONS, "licences": LICENCE_QUESTIONS, "all": QUESTIONS + LICENCE_QUESTIONS}
    docs = corpus()
    print(
        f"{len(docs)} documents, model {encoders['torch'].identity}, overlap 10 %, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n"
    )
    print(
        f"{'size':>5} {'backend':>10} {'set':>9} {'R@1':>6} {'R@3':>6} {'MRR':>6} {'chunks/s':>9} "
        f"{'min cos':>8} {'mean cos':>8}"
    )
    ok = True
    for size in sizes:
        rows, vectors = {}, {}
        for b in backends:
            qsets = {name: (qs, encoders[b].encode([q for q, _, _ in qs])) for name, qs in sets.items()}
            out: dict[str, Any] = {}
            rows[b] = measure(size, docs, settings.embedding_model, qsets, encoders[b], out)
            vectors[b] = np.asarray(out["vectors"])
        for b in backends:
            cos = (vectors[b] * vectors["torch"]).sum(axis=1)
            for name in sets:
                r, t = rows[b][name], rows["torch"][name]
                rate = r["chunks"] / max(r["encode_s"], 1e-9)
                print(
                    f"{size:>5} {b:>10} {name:>9} {r['recall@1']:>6.3f} {r['recall@3']:>6.3f} "
                    f"{r['mrr@10']:>6.3f} {rate:>9.1f} {cos.min():>8.4f} {cos.mean():>8.4f}"
                )
                loss = max(t["recall@1"] - r["recall@1"], t["mrr@10"] - r["mrr@10"])
                if (b == "onnx" and cos.min() < 0.9999) or (b == "onnx-int8" and loss > 0.02):
                    ok = False
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default=None, help="chunk sizes (default 64,96,128,160,192,254,512; 192 to compare)"
    )
    parser.add_argument(
        "--compare-query-encoders",
        action="store_true",
        help="R@1 and MRR with queries encoded by torch and ONNX",
    )
    parser.add_argument(
        "--compare-backends",
        action="store_true",
        help="R@1, MRR, chunks/s and cosine against torch for INGEST_EMBEDDING_BACKEND torch, onnx, onnx-int8",
    )
    args = parser.parse_args(argv)
    if args.compare_backends:
        return compare_backends([int(s) for s in (args.sizes or "192").split(",")])
    if args.compare_query_encoders:
        return compare_query_encoders([int(s) for s in (args.sizes or "192").split(",")])
    args.sizes = args.sizes or "64,96,128,160,192,254,512"
    model = Settings.from_env({}).embedding_model
    docs = corpus()
    embedder = load_embedder(model)
    question_sets = {
        name: (qs, embedder.encode([q for q, _, _ in qs]))
        for name, qs in (
            ("demo", QUESTIONS),
            ("licences", LICENCE_QUESTIONS),
            ("all", QUESTIONS + LICENCE_QUESTIONS),
        )
    }
    print(f"{len(docs)} documents, model {embedder.identity}, overlap 10 %")
    rows = [measure(int(s), docs, model, question_sets) for s in args.sizes.split(",")]
    for name, (questions, _) in question_sets.items():
        print(f"\n{name}: {len(questions)} questions")
        print(
            f"{'size':>5} {'chunks':>6} {'R@1':>6} {'R@3':>6} {'R@5':>6} {'MRR':>6} {'budget k':>8} {'hit@640t':>8}"
        )
        for row in rows:
            r = row[name]
            print(
                f"{r['size']:>5} {r['chunks']:>6} {r['recall@1']:>6.3f} {r['recall@3']:>6.3f} "
                f"{r['recall@5']:>6.3f} {r['mrr@10']:>6.3f} {r['budget_k']:>8} {r['hit@budget']:>8.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

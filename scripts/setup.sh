#!/usr/bin/env bash
# One-time set-up on a fresh machine (idempotent: a second run only checks).
#  1. torch as the local CPU wheel first (a bare `torch` from PyPI pulls a multi-GB CUDA build),
#  2. speccap and its pinned dependencies (editable install),
#  3. WordNet for METEOR, offline: Debian's wordnet files copied where nltk looks, plus the
#     `lexnames` file nltk wants and Debian does not ship.
#  4. as root with apt-get: the daemons the cluster-path tests start (tests/flows/daemons.py):
#     PostgreSQL, and a one-node Slurm cluster (slurm-wlm, munge); and the headless browser that
#     checks the MLflow and Prefect views (chromium, chromium-driver).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
apt_install() {  # Debian packages, as root: the package lists are refreshed when one is not found
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
}

if ! $PY -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
  echo "setup: installing torch 2.13.0 (CPU)"
  $PY -m pip install -q torch==2.13.0
fi
if ! $PY -c 'import speccap, prefect, mlflow, dvc, nltk, rouge_score, espeakng_loader' 2>/dev/null \
   || [ pyproject.toml -nt .setup-done ]; then
  echo "setup: installing speccap and its pinned dependencies"
  $PY -m pip install -q -e '.[dev]'
fi

WN=${NLTK_DATA:-$HOME/nltk_data}/corpora/wordnet
if [ ! -f "$WN/lexnames" ] || [ ! -f "$WN/data.noun" ]; then
  if [ ! -f /usr/share/wordnet/data.noun ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "setup: installing Debian's WordNet files (wordnet-base, wordnet-sense-index)"
      apt_install wordnet-base wordnet-sense-index
    else
      echo "setup: WordNet is missing. Either install Debian's wordnet-base and wordnet-sense-index," >&2
      echo "       or, with internet, run: $PY -m nltk.downloader -d \"${NLTK_DATA:-$HOME/nltk_data}\" wordnet" >&2
      exit 1
    fi
  fi
  mkdir -p "$WN"
  find /usr/share/wordnet -maxdepth 1 -type f -exec cp {} "$WN/" \;
  # nltk's WordNet reader wants lexnames: the 45 lexicographer files (number, name, syntactic category)
  $PY - "$WN/lexnames" <<'PYEOF'
import sys
names = ["adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
         "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling",
         "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object", "noun.person",
         "noun.phenomenon", "noun.plant", "noun.possession", "noun.process", "noun.quantity", "noun.relation",
         "noun.shape", "noun.state", "noun.substance", "noun.time", "verb.body", "verb.change", "verb.cognition",
         "verb.communication", "verb.competition", "verb.consumption", "verb.contact", "verb.creation",
         "verb.emotion", "verb.motion", "verb.perception", "verb.possession", "verb.social", "verb.stative",
         "verb.weather", "adj.ppl"]
cat = {"adj": 3, "adv": 4, "noun": 1, "verb": 2}
with open(sys.argv[1], "w") as fh:
    for i, n in enumerate(names):
        fh.write(f"{i:02d}\t{n}\t{cat[n.split('.')[0]]}\n")
PYEOF
fi
$PY -c 'from nltk.corpus import wordnet as wn; assert wn.synsets("dog"), "WordNet empty"' \
  || { echo "setup: WordNet at $WN does not load" >&2; exit 1; }

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || ! command -v slurmctld >/dev/null \
     || ! command -v munged >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "setup: installing Debian's postgresql, slurm-wlm, munge, chromium and chromium-driver (for the tests)"
    apt_install postgresql slurm-wlm munge chromium chromium-driver
  fi
fi

# dvc needs the repository to be a git work tree with DVC initialised (committed in .dvc/)
touch .setup-done
echo "setup: ok"

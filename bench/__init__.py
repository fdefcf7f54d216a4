"""Mainspring's benchmarks, run by hand from the repository root as ``python -m bench.<script>`` (bench/README.md).

Nothing here imports Mainspring: ``bench.interactions_peers`` runs in the peers' own venv, which does not have it.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: where ``python -m bench.…`` runs from, and what a subprocess needs on PYTHONPATH to
import ``bench`` (an app of this folder served by ``mainspring serve --app bench.…:app``)."""

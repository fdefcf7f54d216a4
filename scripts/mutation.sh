#!/usr/bin/env bash
# A mutation run of the modules that keep Mainspring's guarantees (cosmic-ray; see docs/reliability.md, "Mutation
# testing"). Not part of `make test`: a module takes from minutes to hours.
#
#   scripts/mutation.sh TARGET...      run (or resume) each target of mutation/targets.tsv; `all` for every one
#   scripts/mutation.sh --sample N TARGET...   a new session runs a seeded random N of its mutants (mutation/sample.py;
#                                      DRAW=… to draw another); the others are marked skipped
#   scripts/mutation.sh --list         the targets
#
# Each target runs in a scratch copy of the tree (.mutation/TARGET/tree, the working tree as it is now), so the
# real tree is never left holding a mutant; its session (.mutation/TARGET/session.sqlite) is kept, so a stopped
# run resumes where it stopped (the mutant a killed run left on disk is put back first), and deleting .mutation/TARGET starts it again (after the code changed). The report
# of surviving mutants is .mutation/TARGET/report.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
TOOL_VENV="$ROOT/.venv-mutation"
COSMIC_RAY_VERSION="8.7.0"

targets() { grep -v '^#' mutation/targets.tsv | cut -f1; }

if [[ $# -eq 0 || "$1" == "--list" ]]; then
  targets
  exit 0
fi
[[ -x "$ROOT/.venv/bin/pytest" ]] || { echo "run make setup first" >&2; exit 2; }
if [[ ! -x "$TOOL_VENV/bin/cosmic-ray" ]]; then
  # A venv of its own: the tool never enters the project's dependencies.
  python3 -m venv "$TOOL_VENV"
  "$TOOL_VENV/bin/pip" install -q "cosmic-ray==$COSMIC_RAY_VERSION"
fi

sample=""
if [[ "$1" == "--sample" ]]; then
  sample="$2"
  shift 2
fi
wanted=("$@")
[[ "${wanted[0]}" == "all" ]] && mapfile -t wanted < <(targets)
for target in "${wanted[@]}"; do
  line="$(grep -P "^\Q$target\E\t" mutation/targets.tsv)" || { echo "no target $target (see --list)" >&2; exit 2; }
  module="$(cut -f2 <<<"$line")"
  tests="$(cut -f3 <<<"$line")"
  engines="$(cut -f4 <<<"$line")"
  work="$ROOT/.mutation/$target"
  mkdir -p "$work"
  if [[ ! -f "$work/session.sqlite" ]]; then
    rm -rf "$work/tree"
    mkdir -p "$work/tree"
    git ls-files -co --exclude-standard -z | rsync -a --from0 --files-from=- "$ROOT/" "$work/tree/"
    # Its module as copied: put back before each (re)start, since a run killed mid-mutant leaves one on disk.
    cp "$work/tree/$module" "$work/module.orig"
    sed -e "s#@MODULE@#$module#" -e "s#@TESTS@#$tests#" -e "s#@ENGINES@#$engines#" -e "s#@PYTEST@#$ROOT/.venv/bin/pytest#" \
      mutation/cosmic-ray.toml.in > "$work/cosmic-ray.toml"
    (cd "$work/tree" && "$TOOL_VENV/bin/cosmic-ray" init "$work/cosmic-ray.toml" "$work/session.sqlite"
     "$TOOL_VENV/bin/cr-filter-operators" "$work/session.sqlite" "$work/cosmic-ray.toml"
     "$TOOL_VENV/bin/cr-filter-pragma" "$work/session.sqlite")
    if [[ -n "$sample" ]]; then
      "$TOOL_VENV/bin/python" mutation/sample.py "$work/session.sqlite" "$sample" "${DRAW:-37}" | tee "$work/sample.txt"
    fi
    echo "$target: mutants of $module in $work/session.sqlite"
  fi
  cp "$work/module.orig" "$work/tree/$module"
  (cd "$work/tree" && "$TOOL_VENV/bin/cosmic-ray" exec "$work/cosmic-ray.toml" "$work/session.sqlite")
  "$TOOL_VENV/bin/cr-report" --surviving-only --show-diff "$work/session.sqlite" > "$work/report.txt"
  tail -n 4 "$work/report.txt"
done

#!/usr/bin/env bash
# Installs public-domain books for long-context perplexity (../shared/data/README.md): each
# comes from a Debian package's test data, fetched with `apt-get download` (no dependencies,
# nothing installed system-wide) and stripped of the Project Gutenberg header and footer.
# Output: <repo>/data/books/<name>.txt (gitignored). Idempotent.
#   scripts/install_books.sh            # all books below
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$repo/data/books"
mkdir -p "$out"
# name  package  path inside the package
books=(
  "sherlock_holmes golang-github-bkaradzic-go-lz4-dev usr/share/gocode/src/github.com/bkaradzic/go-lz4/testdata/pg1661.txt"
  "moby_dick golang-github-colinmarc-hdfs-dev usr/share/gocode/src/github.com/colinmarc/hdfs/testdata/mobydick.txt"
)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for b in "${books[@]}"; do
  read -r name pkg path <<<"$b"
  [[ -s "$out/$name.txt" ]] && continue
  (cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1) ||
    { echo "install_books: apt-get download $pkg failed (run apt-get update?)" >&2; exit 1; }
  dpkg-deb -x "$tmp/${pkg}"_*.deb "$tmp/$name"
  python3 - "$tmp/$name/$path" "$out/$name.txt" <<'PY'
import sys
src, dst = sys.argv[1], sys.argv[2]
text = open(src, encoding="utf-8-sig", errors="strict").read().replace("\r\n", "\n")
lines = text.split("\n")
start = next((i for i, l in enumerate(lines) if l.startswith("*** START OF")), None)
end = next((i for i, l in enumerate(lines) if l.startswith("*** END OF")), None)
if start is not None and end is not None and start < end:
    lines = lines[start + 1:end]  # Gutenberg header / licence footer removed
lines = [l for l in lines if not l.startswith(("End of Project Gutenberg", "End of the Project Gutenberg"))]
body = "\n".join(lines).strip() + "\n"
if len(body.split()) < 10000:
    sys.exit(f"install_books: {src} looks wrong ({len(body.split())} words)")
open(dst, "w", encoding="utf-8").write(body)
print(f"install_books: {dst} ({len(body.split())} words)")
PY
done

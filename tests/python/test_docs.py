"""docs/python.md's examples run: every ```python block that starts with `import kvtrim`."""
import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def blocks():
    return [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if b.startswith("import kvtrim")]


def test_the_guide_has_a_runnable_example():
    assert blocks()


def test_the_guides_examples_run(model, capsys):
    for code in blocks():
        exec(compile(code, str(DOC), "exec"), {"__name__": "__docs__"})
    out = capsys.readouterr().out
    assert "->" in out and "bytes for" in out

"""kvpress's README example with only its import changed, against `kvtrim run` with the same
press; kvtrim.eval rows."""
import subprocess

import pytest

import kvtrim

CONTEXT = ("The Ardent Lighthouse stands on the northern cape of Velm Island. It was built in 1874 by the "
           "engineer Maren Oskarsdottir, who also designed the harbour wall. Its lamp was first lit on "
           "the ninth of October, and the keeper that winter was her brother Jonas. ") * 3
QUESTION = "\nWho built the Ardent Lighthouse?"


def kvpress_readme_example(model_name):
    # kvpress's README, with `from transformers import pipeline` and `from kvpress import ...`
    # replaced by this import, the model a GGUF name:
    from kvtrim.kvpress import pipeline, ExpectedAttentionPress

    device = "cpu"
    with pytest.warns(UserWarning, match="ignores device"):  # kvtrim runs the GGUF file on the CPU
        pipe = pipeline("kv-press-text-generation", model=model_name, device=device)
    context = CONTEXT
    question = QUESTION  # optional
    press = ExpectedAttentionPress(compression_ratio=0.5)
    answer = pipe(context, question=question, press=press)["answer"]
    return answer, press


def test_the_kvpress_readme_example_runs_and_answers_as_kvtrim_run(model, kvtrim_bin):
    answer, press = kvpress_readme_example(model.path)
    assert answer
    cli = subprocess.run([kvtrim_bin, "run", "-m", model.path, "--chat", "--context", CONTEXT, "-p", QUESTION,
                          "--press", str(press), "-n", "50", "--temp", "0", "-t", "0"],
                         capture_output=True, text=True, check=True)
    assert cli.stdout == answer + "\n"
    assert "context" in cli.stderr and "->" in cli.stderr  # the press ran on the context


def test_pipeline_many_questions(model):
    pipe = kvtrim.pipeline(model)
    out = pipe(CONTEXT, questions=["Who built it?", "When was the lamp first lit?"],
               press=kvtrim.presses.SnapKV(0.5), max_new_tokens=8)
    assert len(out["answers"]) == 2 and all(out["answers"])


def test_eval_ruler_rows(model, tmp_path):
    out = tmp_path / "r.jsonl"
    rows = kvtrim.eval.ruler(model=model, press=kvtrim.presses.SnapKV(0.5), tasks="niah_single_1", samples=2,
                             ctx_len=512, threads=2, out=out)
    assert len(rows) == 2
    assert {"task", "score"} <= set(rows[0])
    assert out.exists()
    # the same call again resumes: nothing is run twice, the rows come back
    assert kvtrim.eval.ruler(model=model, press="snapkv:0.5", tasks="niah_single_1", samples=2, ctx_len=512,
                             threads=2, out=out) == rows


def test_eval_bad_option_is_a_value_error(model):
    with pytest.raises(ValueError, match="ctx-lenn|ctx_lenn"):
        kvtrim.eval.ruler(model=model, ctx_lenn=5)

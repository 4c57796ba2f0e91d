#!/usr/bin/env python3
"""The official `openai` Python client against a running kvtrim serve: a completion, a chat,
and a streamed chat (usage: server_openai.py BASE_URL). Exit 77 (ctest: skipped) when the
client is not installed."""
import sys

try:
    import openai
except ImportError:
    print("openai client not installed (scripts/install_deps.sh --test installs it)")
    sys.exit(77)

base = sys.argv[1].rstrip("/") + "/v1"
client = openai.OpenAI(base_url=base, api_key="unused")
models = client.models.list()
model = models.data[0].id
c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
assert c.choices[0].text.strip(), c
assert c.usage.completion_tokens > 0, c
chat = client.chat.completions.create(model=model, temperature=0, max_tokens=24,
                                      messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])
assert "Paris" in chat.choices[0].message.content, chat
parts, finish = [], None
for chunk in client.chat.completions.create(model=model, temperature=0, max_tokens=24, stream=True,
                                            messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]):
    if chunk.choices:
        parts.append(chunk.choices[0].delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
streamed = "".join(parts)
assert streamed == chat.choices[0].message.content, (streamed, chat.choices[0].message.content)
assert finish in ("stop", "length"), finish
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=10**9)
    raise AssertionError("no error for max_tokens 1e9")
except openai.BadRequestError as e:
    assert "max_tokens" in str(e), e
print(f"openai {openai.__version__}: completion, chat, stream ok: {streamed!r}")

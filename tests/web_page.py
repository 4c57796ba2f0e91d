#!/usr/bin/env python3
"""kvtrim serve's web page in headless Chromium, driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: the standard library is enough). Opens URL (an ?autosend= page), waits
until the page says its reply is over (it sets <body data-done="1"> when a reply ends, whether
finished or failed) and the cache heat map is drawn (a .cell; not awaited after a failed reply),
then writes the DOM and a screenshot. The wait has an upper bound that only catches a hang; when it fires, it says what it
was waiting for and what the page's status line shows.
usage: web_page.py CHROMIUM URL DOM_OUT PNG_OUT [TIMEOUT_S (default 300)]"""
import base64
import fcntl
import json
import os
import select
import subprocess
import sys
import tempfile
import time

browser, url, dom_out, png_out = sys.argv[1:5]
timeout_s = float(sys.argv[5]) if len(sys.argv) > 5 else 300.0
deadline = time.monotonic() + timeout_s


class Hang(Exception):
    pass


waiting_for = "Chromium to open the page"


# Chromium reads commands from its fd 3 and writes replies and events to its fd 4, each message
# JSON ended by a NUL byte. The pipes are moved above 9 first so that the dup2 to 3 and 4 in the
# child cannot overwrite one another.
def high(fd):
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


cmd_r, cmd_w = map(high, os.pipe())
ev_r, ev_w = map(high, os.pipe())


def child_fds():
    os.dup2(cmd_r, 3)
    os.dup2(ev_w, 4)


profile = tempfile.mkdtemp()
proc = subprocess.Popen(
    [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
     "--user-data-dir=" + profile, "--remote-debugging-pipe", "--window-size=1280,900", "about:blank"],
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(os.path.join(profile, "chrome.log"), "w"),
    pass_fds=(3, 4), preexec_fn=child_fds)
os.close(cmd_r)
os.close(ev_w)
buf = b""
next_id = 0


def call(method, session=None, **params):
    """Sends one command and returns its result (events in between are dropped)."""
    global buf, next_id
    next_id += 1
    msg = {"id": next_id, "method": method, "params": params}
    if session:
        msg["sessionId"] = session
    os.write(cmd_w, json.dumps(msg).encode() + b"\0")
    while True:
        while b"\0" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([ev_r], [], [], left)[0]:
                raise Hang()
            chunk = os.read(ev_r, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its pipe; its log:")
            buf += chunk
        raw, buf = buf.split(b"\0", 1)
        reply = json.loads(raw)
        if reply.get("id") == next_id:
            if "error" in reply:
                raise RuntimeError("%s: %s" % (method, reply["error"]))
            return reply.get("result", {})


def evaluate(session, expr):
    r = call("Runtime.evaluate", session, expression=expr, returnByValue=True)
    return r.get("result", {}).get("value")


status = "(no page)"
try:
    target = call("Target.createTarget", url=url)["targetId"]
    session = call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    # (a failed reply, status in red, does not wait for the heat map: the caller's check fails)
    waiting_for = "the reply to end (body data-done=\"1\") and the heat map (.cell)"
    ready = ("!!(document.body && document.body.dataset.done === '1' && (document.querySelector('.cell') || "
             "document.getElementById('status').classList.contains('error')))")
    while not evaluate(session, ready):
        status = evaluate(session, "(document.getElementById('status') || {}).textContent") or status
        if time.monotonic() > deadline:
            raise Hang()
        time.sleep(0.2)
    waiting_for = "the DOM and the screenshot"
    dom = evaluate(session, "document.documentElement.outerHTML")
    with open(dom_out, "w") as f:
        f.write(dom)
    png = call("Page.captureScreenshot", session, format="png")["data"]
    with open(png_out, "wb") as f:
        f.write(base64.b64decode(png))
    os.write(cmd_w, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
    proc.wait(timeout=60)
except Hang:
    print("web_page.py: still waiting after %.0f s for %s; the page's status: %r" % (timeout_s, waiting_for, status))
    sys.exit(1)
except Exception as e:
    print("web_page.py: %s\n%s" % (e, open(os.path.join(profile, "chrome.log")).read()[-1500:]))
    sys.exit(1)
finally:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    subprocess.run(["rm", "-rf", profile])

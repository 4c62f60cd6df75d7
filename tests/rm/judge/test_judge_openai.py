"""The openai judge against a small in-test HTTP server on 127.0.0.1, for the faults a real server
will not produce on demand: garbage text, a 500 then success, a hang past the timeout; plus the API
key, the concurrency limit, and a server that is down (one line, exit 1, nothing written).

The answer shapes follow the legacy completions API as llama-cpp-python 0.3 serves it
(`choices[0].logprobs.top_logprobs[0]` = {token: logprob}; llama_cpp/llama_types.py) and the chat
completions API (`choices[0].message.content`).
"""

import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from annotation.ingest.batch import ingest_records
from annotation.rlaif.constitution import load_constitution
from rm.judge.local import JudgeError
from rm.judge.openai_server import OpenAIJudge

HELPFUL = load_constitution("helpful")
ITEM = ("Name a red fruit.", "An apple.", "A banana.", HELPFUL.principles[0].text)


def logprob_answer(p_a: float) -> dict:
    top = {"A": math.log(p_a), " B": math.log(1 - p_a) - 0.0, "C": math.log(0.01)}
    return {"choices": [{"text": "A", "logprobs": {"tokens": ["A"], "top_logprobs": [top]}}]}


class FakeServer:
    """Answers each POST with the next of `script` (a dict body, an int status, or ('sleep', s))."""

    def __init__(self, script, repeat_last=True):
        self.script, self.repeat_last = list(script), repeat_last
        self.hits, self.paths, self.headers, self.inflight, self.max_inflight = 0, [], [], 0, 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.lock:
                    step = outer.script[min(outer.hits, len(outer.script) - 1)]
                    outer.hits += 1
                    outer.paths.append(self.path)
                    outer.headers.append(self.headers.get("Authorization"))
                    outer.inflight += 1
                    outer.max_inflight = max(outer.max_inflight, outer.inflight)
                try:
                    if isinstance(step, tuple):
                        time.sleep(step[1])
                        step = step[2] if len(step) > 2 else logprob_answer(0.7)
                    if isinstance(step, int):
                        self.send_response(step)
                        self.end_headers()
                        return
                    body = json.dumps(step).encode() if isinstance(step, dict) else step
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with outer.lock:
                        outer.inflight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def judge(url, **kw):
    kw.setdefault("backoff", 0.01)
    return OpenAIJudge(url, HELPFUL.split, **kw)


def test_logprobs_give_the_normalised_label_mass():
    with FakeServer([logprob_answer(0.7)]) as server:
        assert judge(server.url).prefer([ITEM]) == [pytest.approx(0.7)]
        assert server.paths == ["/v1/completions"]


def test_500_then_success_is_retried():
    with FakeServer([500, logprob_answer(0.25)]) as server:
        assert judge(server.url).prefer([ITEM]) == [pytest.approx(0.25)]
        assert server.hits == 2


def test_garbage_text_is_a_failure_never_a_guess():
    garbage_completion = {"choices": [{"text": "well", "logprobs": None}]}
    garbage_chat = {"choices": [{"message": {"content": "The first one, probably. [[A] or B"}}]}
    with FakeServer([garbage_completion, garbage_chat]) as server:
        assert judge(server.url).prefer([ITEM]) == [None]
        assert server.paths == ["/v1/completions", "/v1/chat/completions"]
    with FakeServer([b"<html>not json</html>"]) as server:
        assert judge(server.url).prefer([ITEM]) == [None]


def test_strict_verdict_when_the_server_gives_no_logprobs():
    chat = {"choices": [{"message": {"content": "Response B is wrong. [[A]]"}}]}
    with FakeServer([{"choices": [{"text": "A"}]}, chat]) as server:
        assert judge(server.url).prefer([ITEM]) == [1.0]


def test_a_hang_past_the_timeout_fails_within_the_retries():
    with FakeServer([("sleep", 3.0)]) as server:
        started = time.perf_counter()
        with pytest.raises(JudgeError, match="no answer within 0.3 s after 2 tries"):
            judge(server.url, timeout=0.3, retries=1).prefer([ITEM])
        assert time.perf_counter() - started < 2.5


def test_api_key_and_concurrency_limit(monkeypatch):
    monkeypatch.setenv("BRADLEY_JUDGE_API_KEY", "sk-test-123")
    with FakeServer([("sleep", 0.1, logprob_answer(0.6))]) as server:
        out = judge(server.url, concurrency=2).prefer([ITEM] * 8)
        assert out == [pytest.approx(0.6)] * 8
        assert set(server.headers) == {"Bearer sk-test-123"} and server.max_inflight == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", ["down", "hang"])
def test_label_cli_server_down_or_hanging_one_line_exit_1_nothing_written(tmp_path, capsys, case):
    from annotation.store import Store
    from service.cli.main import main

    db = str(tmp_path / "s.duckdb")
    with Store(db) as store:
        ingest_records(store, [{"prompt": "q", "chosen": "a", "rejected": "b"}], fmt="trl", source="h")
    server = FakeServer([("sleep", 3.0)])
    url = f"http://127.0.0.1:{free_port()}/v1" if case == "down" else server.url
    if case == "hang":
        server.__enter__()
    try:
        code = main(["--db", db, "label", "--judge", f"openai:{url}", "--constitution", "helpful",
                     "--timeout", "0.3", "--retries", "1"])
    finally:
        if case == "hang":
            server.__exit__()
    out = capsys.readouterr()
    assert code == 1 and out.out == "" and len(out.err.strip().splitlines()) == 1, out.err
    assert "after 2 tries" in out.err
    with Store(db) as store:
        assert store.counts()["judgments"] == 1

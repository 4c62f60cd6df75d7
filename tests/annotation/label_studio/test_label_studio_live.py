"""The Label Studio loop against a real Label Studio server (tests/ls_server.py: label-studio 1.23.2
in a cached venv of its own, SQLite, 127.0.0.1, stopped by PID), through label-studio-sdk 2.x.

Annotations are posted through the API as an annotator would (SDK `annotations.create(id=task_id,
result=[...])`, label_studio_sdk/annotations/client.py of 2.1.2), by the admin and by a second user
created in Label Studio's Django shell; the second user's results are what the labeling UI of
bradley's config sends (`<Pairwise>`: type pairwise, value.selected; `<Choices>`: value.choices;
`<TextArea>`: value.text).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from annotation.ingest.batch import IngestError, ingest_records
from annotation.label_studio import ledger as ls_ledger
from annotation.label_studio import sync as ls
from annotation.store import Store
from tests import ls_server

pytestmark = pytest.mark.slow
RATER2 = ("rater2@bradley.test", "rater2-password", "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00")
SECRET = "webhook-secret-0123456789abcdef"
API_KEY = "test-api-key-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    began = time.monotonic()
    srv = ls_server.launch(tmp_path_factory.mktemp("ls"))
    yield srv
    srv.stop()
    print(f"\nlabel-studio set-up timings: {ls_server.TIMINGS}, module "
          f"{time.monotonic() - began:.1f} s", file=sys.stderr)


@pytest.fixture(scope="module")
def admin(server):
    return ls.connect(server.url, ls_server.TOKEN)


@pytest.fixture(scope="module")
def rater2(server):
    """(user id, client) of a second annotator in the admin's organization."""
    email, password, token = RATER2
    out = server.shell(
        "from users.models import User\n"
        "from organizations.models import Organization\n"
        "from rest_framework.authtoken.models import Token\n"
        "org = Organization.objects.first()\n"
        f"u = User.objects.filter(email='{email}').first() or "
        f"User.objects.create_user(email='{email}', password='{password}')\n"
        "org.add_user(u) if not org.has_user(u) else None\n"
        "u.active_organization = org\n"
        "u.save()\n"
        f"Token.objects.filter(user=u).update(key='{token}')\n"
        "print('USER', u.id)\n")
    user_id = int(re.search(r"USER (\d+)", out).group(1))
    return user_id, ls.connect(server.url, token)


def seed(store, prompts=3, responses=3):
    """`prompts` prompts with `responses` answers each (an AI vote on neighbours makes them
    exist): prompts x C(responses, 2) candidate pairs."""
    rows = [{"prompt": f"Question {p}?", "response_a": f"answer {p}.{r}",
             "response_b": f"answer {p}.{r + 1}", "winner": "a", "rater": "ai:seed"}
            for p in range(prompts) for r in range(responses - 1)]
    ingest_records(store, rows)


def pick(side):
    return {"from_name": "comparison", "to_name": "answer1,answer2", "type": "pairwise",
            "value": {"selected": side}}


def choice(value):
    return {"from_name": "verdict", "to_name": "prompt", "type": "choices", "value": {"choices": [value]}}


def note(text):
    return {"from_name": "rationale", "to_name": "prompt", "type": "textarea", "value": {"text": [text]}}


def tasks_of(store, proj):
    return store.con.execute("SELECT task_id, prompt_id, response_a, response_b, swapped FROM ls_tasks "
                             "WHERE project_id = ? ORDER BY task_id", [proj["project_id"]]).fetchall()


def verdicts(store):
    """{(rater, response_a id, response_b id): (winner, rationale)} of the store's LS judgments."""
    t = store.judgments()
    cols = [t.column(c).to_pylist() for c in ("rater", "response_a", "response_b", "winner",
                                               "rationale", "source")]
    return {(r, a, b): (w, why) for r, a, b, w, why, src in zip(*cols, strict=True)
            if src == "label-studio"}


def test_setup_push_pull_update_delete_and_idempotent_repull(server, admin, rater2, tmp_path):
    store = Store(tmp_path / "loop.duckdb")
    seed(store)
    first = ls.setup(store, admin, server.url, "loop", overlap=2)
    again = ls.setup(store, admin, server.url + "/", "loop", overlap=2)
    assert first["created"] and not again["created"] and first["project_id"] == again["project_id"]
    assert admin.projects.get(id=first["project_id"]).maximum_annotations == 2
    proj = ls.project(store, server.url)

    assert ls.push(store, admin, proj, "random", limit=5)["pushed"] == 5
    assert ls.push(store, admin, proj, "coverage", limit=100)["pushed"] == 4  # 9 pairs in all
    assert ls.push(store, admin, proj, "random", limit=100)["pushed"] == 0  # each pair once
    tasks = tasks_of(store, proj)
    assert len(tasks) == 9 == len(list(admin.tasks.list(project=proj["project_id"])))
    assert {t[4] for t in tasks} == {True, False}  # both presentations occur

    user2, client2 = rater2
    for task_id, *_ in tasks:  # the admin always clicks the answer shown on the left
        admin.annotations.create(id=task_id, result=[pick("left")])
    shown = {t[0]: t for t in tasks}
    (t_tie, _, _, _, _), (t_right, *_), (t_bad, *_) = tasks[:3]
    a_tie = client2.annotations.create(id=t_tie, result=[choice("Tie"), note("both say 4")])
    a_right = client2.annotations.create(id=t_right, result=[pick("right")])
    client2.annotations.create(id=t_bad, result=[choice("Both bad"), pick("left")])
    client2.annotations.create(id=tasks[3][0], result=[], was_cancelled=True)  # skipped

    summary = ls.pull(store, admin, ls.project(store, server.url))
    assert (summary["annotations_ok"], summary["cancelled"], summary["errors"]) == (12, 1, [])
    got = verdicts(store)
    assert len(got) == 12
    for _, _, a, b, swapped in tasks:  # "left" undone: the pair's b when it was shown left
        assert got[("human:ls:1", a, b)] == ("b" if swapped else "a", None)
    assert got[(f"human:ls:{user2}", *shown[t_tie][2:4])] == ("tie", "both say 4")
    assert got[(f"human:ls:{user2}", *shown[t_right][2:4])][0] == ("a" if shown[t_right][4] else "b")
    assert got[(f"human:ls:{user2}", *shown[t_bad][2:4])][0] == "tie"
    stamp = store.con.execute("SELECT min(created_at) FROM judgments WHERE source = 'label-studio'"
                              ).fetchone()[0]
    assert stamp is not None and stamp.year >= 2024

    client2.annotations.update(id=a_right.id, result=[pick("left")])  # an edit replaces the verdict
    client2.annotations.delete(id=a_tie.id)  # a deletion retracts it
    summary = ls.pull(store, admin, ls.project(store, server.url))
    assert (summary["annotations_ok"], summary["deleted"]) == (1, 1)
    got = verdicts(store)
    assert len(got) == 11 and (f"human:ls:{user2}", *shown[t_tie][2:4]) not in got
    assert got[(f"human:ls:{user2}", *shown[t_right][2:4])][0] == ("b" if shown[t_right][4] else "a")

    batches = store.counts()["batches"]
    again = ls.pull(store, admin, ls.project(store, server.url))
    assert (again["tasks"], again["annotations_ok"]) == (0, 0)
    full = ls.pull(store, admin, ls.project(store, server.url), full=True)  # every task re-read
    assert (full["annotations_ok"], full["deleted"]) == (0, 0)
    assert verdicts(store) == got and store.counts()["batches"] - batches <= 1
    store.close()


def test_invalid_results_are_reported_per_annotation(server, admin, tmp_path):
    """Label Studio stores these without complaint; bradley names each annotation and stores none."""
    store = Store(tmp_path / "invalid.duckdb")
    seed(store, prompts=1, responses=3)
    ls.setup(store, admin, server.url, "invalid")
    proj = ls.project(store, server.url)
    ls.push(store, admin, proj, "random", limit=3)
    (t1, *_), (t2, *_), (t3, *_) = tasks_of(store, proj)
    bad = {admin.annotations.create(id=t1, result=[pick("middle")]).id: "result.value.selected",
           admin.annotations.create(id=t2, result=[{**pick("left"), "from_name": "nosuch"}]).id:
               "result[0].from_name",
           admin.annotations.create(id=t3, result=[{**choice("Tie"), "from_name": "comparison"}]).id:
               "result[0].type"}
    with pytest.raises(IngestError) as info:
        ls.pull(store, admin, proj)
    fields = {e.split(": ")[1] for e in info.value.errors}
    assert fields == {f"annotation[{aid}].{field}" for aid, field in bad.items()}
    assert store.counts()["judgments"] == 2  # the seed's only
    summary = ls.pull(store, admin, ls.project(store, server.url), on_error="skip")
    assert (summary["annotations_ok"], summary["rejected"]) == (0, 3)
    store.close()


def _serve(db, port):
    env = {**os.environ, "BRADLEY_API_KEYS": API_KEY, "BRADLEY_LABEL_STUDIO_WEBHOOK_SECRET": SECRET,
           "BRADLEY_PORT": str(port)}
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "--db", str(db), "serve"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"bradley serve did not start: {process.stderr.read().decode()[-2000:]}")


def _webhook_calls(url) -> int:
    text = httpx.get(url + "/metrics").text
    return int(sum(float(v) for v in re.findall(
        r'bradley_responses_total\{route="/webhooks/label-studio",status="\d+"\} ([0-9.e+]+)', text)))


def _cli(db, server, *args):
    env = {**os.environ, "LABEL_STUDIO_API_KEY": ls_server.TOKEN, "LABEL_STUDIO_URL": server.url}
    out = subprocess.run([sys.executable, "-m", "service.cli", "--db", str(db), "label-studio", *args],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_webhooks_from_the_server_reach_bradley_serve(server, admin, rater2, tmp_path):
    db = tmp_path / "served.duckdb"
    with Store(db) as store:
        seed(store, prompts=2, responses=2)
    project_id = _cli(db, server, "setup", "--title", "webhooks", "--overlap", "2")["project_id"]
    assert _cli(db, server, "push", "--limit", "10")["pushed"] == 2
    process, url = _serve(db, ls_server.free_port())
    try:
        admin.webhooks.create(project=project_id, url=url + "/webhooks/label-studio",
                              headers={"X-Bradley-Webhook-Secret": SECRET}, send_payload=True,
                              send_for_all_actions=False, actions=[
                                  "ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_DELETED"])
        task_ids = [t.id for t in admin.tasks.list(project=project_id)]
        first = admin.annotations.create(id=task_ids[0], result=[pick("left")])
        rater2[1].annotations.create(id=task_ids[0], result=[pick("right"), note("shorter")])
        gone = admin.annotations.create(id=task_ids[1], result=[pick("left")])
        admin.annotations.update(id=first.id, result=[pick("right")])
        admin.annotations.delete(id=gone.id)
        deadline = time.monotonic() + 60
        while _webhook_calls(url) < 5 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _webhook_calls(url) >= 5
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    with Store(db) as store:
        got = verdicts(store)
        assert len(got) == 2 and {r for r, _, _ in got} == {"human:ls:1", f"human:ls:{rater2[0]}"}
        swapped = dict(store.con.execute("SELECT task_id, swapped FROM ls_tasks").fetchall())
        assert got[next(k for k in got if k[0] == "human:ls:1")][0] == (
            "a" if swapped[task_ids[0]] else "b")  # the edit, "right" undone
        n_before = store.counts()["judgments"]
    assert _cli(db, server, "pull")["annotations_ok"] == 0  # nothing the webhooks brought twice
    with Store(db) as store:
        assert verdicts(store) == got and store.counts()["judgments"] == n_before
        assert ls_ledger.projects(store)[0]["pull_cursor"]

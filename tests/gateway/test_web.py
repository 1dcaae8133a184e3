"""The web chat page: served with a strict policy, and its client (gateway/web/chat.js, run by Node)
holds a conversation with a real gateway, worker and event stream."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from shared.llm_images import NOT_SHOWN
from tests.fakes.server import ThreadServer
from tests.support.stack import API_KEY, Stack

CLIENT = Path(__file__).with_name("web_client.mjs")


def test_the_page_is_served_without_a_key_and_with_a_strict_policy(stack: Stack) -> None:
    with TestClient(create_app(stack.settings)) as anonymous:
        page = anonymous.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script type="module" src="/web/chat.js">' in page.text
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
        assert anonymous.get("/web/chat.js").headers["content-type"].startswith("text/javascript")
        assert anonymous.get("/web/chat.css").status_code == 200
        assert anonymous.get("/web/index.py").status_code == 404
        assert anonymous.get("/web/..%2Froutes%2Fweb.py").status_code == 404
        assert anonymous.get("/api/v1/tools").status_code == 401  # the page opens nothing else


def _client(stack: Stack, *messages: str) -> dict[str, Any]:
    """What the page's client (web_client.mjs, in Node) saw sending `messages` to a gateway of `stack`."""
    server = ThreadServer(create_app(stack.settings)).start()
    try:
        done = subprocess.run(["node", str(CLIENT), server.url, API_KEY, *messages], capture_output=True, text=True,
                              timeout=90, check=False)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_the_pages_client_chats_and_follows_the_event_stream(stack: Stack) -> None:
    out = _client(stack, "hello", "call:time", "photo:look")
    first, second, photo = out["replies"]
    assert (first["text"], first["status"]) == ("echo: hello", "succeeded")
    assert [c["toolName"] for c in second["toolCalls"]] == ["time"] and second["status"] == "succeeded"
    events = out["events"]
    assert photo["text"] == f"echo: {NOT_SHOWN.format(n=1)}\nlook"  # the stack's model sees no images
    assert events.count("run.started") == 3 and events.count("run.finished") == 3
    assert events.index("tool.started") < events.index("tool.finished")
    assert [(m["role"], m["content"]) for m in out["history"]][:2] == [("USER", "hello"), ("ASSISTANT", "echo: hello")]
    assert [m["role"] for m in out["history"]] == ["USER", "ASSISTANT"] * 3
    assert out["history"][4]["content"] == "look [1 photo]"
    assert out["unknown"] == 404
    assert out["listed"] == {"mine": True, "title": "hello"}


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_the_pages_client_downloads_the_files_the_agent_sends(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack(TOOLS__ALLOWED=json.dumps(["message"]), PERMISSIONS__GRANTED=json.dumps(["FS_READ"]))
    (stack.workspace / "notes.md").write_text("# Notes\nbuy milk\n")
    stack.worker()
    out = _client(stack, 'call:message{"content": "your notes", "files": ["notes.md"]}')
    assert out["downloads"] == [{"name": "notes.md", "size": "17 B", "type": "text/markdown",
                                 "text": "# Notes\nbuy milk\n"}]
    # Reopened later, the page shows what was sent, with its link, between the request and the answer
    roles = [m["role"] for m in out["history"]]
    assert roles == ["USER", "SENT", "ASSISTANT"]
    sent = out["history"][1]
    assert sent["content"] == "your notes" and [f["name"] for f in sent["files"]] == ["notes.md"]
    assert sent["files"][0]["url"] == out["linked"][0]["url"]


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.parametrize(("first", "title"), [
    pytest.param("a" * 59 + "\U0001f600 and then some", "a" * 59 + "\U0001f600", id="an emoji across the cut"),
    pytest.param("photo:", "Photo", id="a photo alone")])
def test_the_page_names_a_conversation_after_its_first_message(stack: Stack, first: str, title: str) -> None:
    """The title the page gives is one the API takes: never half an emoji (a lone surrogate, 422),
    never empty for a message that is only photos."""
    assert _client(stack, first)["listed"] == {"mine": True, "title": title}


TITLES_AND_PHOTOS = """
import { photoProblem, titleOf } from "%s";
const out = { titles: [], broken: [], problems: [] };
for (const text of ["  hello  ", "", "   ", "/new"]) out.titles.push(titleOf(text, 0), titleOf(text, 3));
for (let at = 50; at < 70; at++) {  // an emoji, a flag and a family at every place around the cut
  for (const odd of ["\\u{1F600}", "\\u{1F1EB}\\u{1F1F7}", "\\u{1F468}\\u200D\\u{1F469}\\u200D\\u{1F467}"]) {
    const title = titleOf("x".repeat(at) + odd.repeat(40), 0);
    if (!title.isWellFormed() || [...title].length > 60 || !title) out.broken.push([at, odd, title]);
  }
}
const photo = (name, size, type = "image/jpeg") => ({ name, size, type });
for (const files of [[photo("a.jpg", 5 * 1024 * 1024), photo("b.png", 1, "image/png"), photo("c.gif", 1, "image/gif"),
                      photo("d.webp", 1, "image/webp")],
                     [photo("a.jpg", 1), photo("big.jpg", 5 * 1024 * 1024 + 1)],
                     [photo("IMG_0001.HEIC", 1, "image/heic")],
                     Array.from({ length: 5 }, (_, i) => photo(`p${i}.jpg`, 1))]) {
  out.problems.push(photoProblem(files));
}
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_the_page_checks_titles_and_photos_before_sending() -> None:
    """What the page sends is what the API takes: a title cut between characters, and photos it
    refuses named before anything is sent (too many, too large, not a type a model takes)."""
    script = TITLES_AND_PHOTOS % (Path(__file__).parents[2] / "gateway" / "web" / "chat.js").as_uri()
    done = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["titles"] == ["hello", "hello", "Photo", "3 photos", "Photo", "3 photos", "/new", "/new"]
    assert out["broken"] == []
    assert out["problems"] == [
        None,
        '"big.jpg" is too large (5.2 MB): a photo may be at most 5 MiB (5,242,880 bytes).',
        '"IMG_0001.HEIC" is not a photo the model takes: pick a JPEG, PNG, GIF or WebP image.',
        "5 photos picked: send at most 4 with a message.",
    ]


STREAM_AND_PROXIES = """
import { Client } from "%s";
const stream = "id: 1-0\\r\\nevent: text.delta\\r\\ndata: {\\"text\\": \\"hi\\"}\\r\\n\\r\\n"
  + "id: 2-0\\r\\nevent: run.finished\\r\\ndata: {}\\r\\n\\r\\n";
const answers = [];  // what fetch answers next: a stream cut in two, or a response of a proxy or the gateway
globalThis.fetch = async () => answers.shift();
const cut = (at) => new Response(new ReadableStream({ start(c) {
  const bytes = new TextEncoder().encode(stream);
  c.enqueue(bytes.slice(0, at)); c.enqueue(bytes.slice(at)); c.close();
} }), { headers: { "content-type": "text/event-stream" } });
const client = new Client("http://gateway", "key");
const out = { misread: [], post: null, chat: null };
for (let at = 1; at < stream.length; at++) {
  answers.push(cut(at));
  const seen = [];
  for await (const { id, event } of client.events("c1", undefined, "0")) seen.push(`${id} ${event}`);
  if (seen.join(",") !== "1-0 text.delta,2-0 run.finished") out.misread.push([at, seen]);
}
const proxy504 = () => new Response("<html>Gateway Time-out</html>", { status: 504, statusText: "Gateway Time-out" });
answers.push(proxy504());
await client.post("c1", "hello").then((p) => { out.post = ["sent", p]; }, (e) => { out.post = [e.status, e.message]; });
answers.push(new Response(JSON.stringify({ detail: "no answer", conversationId: "c1", runId: null }), { status: 504 }));
out.chat = await client.chat("c1", "hello");
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_the_pages_client_reads_a_line_break_cut_between_chunks_and_a_proxys_timeout() -> None:
    """Each chunk's "\\r\\n" was made "\\n" on its own: one cut between "\\r" and "\\n" made two line
    breaks, an event lost its type (a finished run read as a `message`, a blank bubble, no answer).
    A proxy's 504 was taken for an answer: "not sent: Cannot read properties of null"."""
    script = STREAM_AND_PROXIES % (Path(__file__).parents[2] / "gateway" / "web" / "chat.js").as_uri()
    done = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["misread"] == []
    status, message = out["post"]
    assert status == 504 and "Gateway Time-out (it may have reached the agent" in message, out["post"]
    assert out["chat"] == {"text": "", "status": "queued", "toolCalls": []}  # the gateway's own 504: the turn goes on

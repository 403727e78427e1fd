"""A stopping run cuts the llm agent's model requests at once (benchmarks.agents.calls), over real sockets.

The hung endpoint is a real listening socket that never accepts: the kernel completes the TCP handshake and
takes the request, and no reply ever comes, as with a wedged inference server behind a load balancer.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.agents import LLMAgent, ModelUnavailableError
from benchmarks.agents.calls import Calls
from benchmarks.agents.chat import ChatEndpoint, complete
from tests.support.servers.chat_server import ChatServer
from tests.support.servers.internet_server import tls_context
from tests.support.servers.testca import TestCA

pytest_plugins = ["tests.support.servers.chat_server"]

MESSAGES = ({"role": "user", "content": "hello"},)


@pytest.fixture
def hung_url() -> Iterator[str]:
    """An endpoint that takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"


def ask_in_thread(endpoint: ChatEndpoint, calls: Calls) -> tuple[threading.Thread, list[BaseException | str]]:
    outcome: list[BaseException | str] = []

    def ask() -> None:
        try:
            outcome.append(complete(endpoint, MESSAGES, calls=calls).content)
        except BaseException as exc:  # the test reads it
            outcome.append(exc)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.timeout(60)
def test_a_request_waiting_on_a_hung_endpoint_ends_when_the_calls_are_cut(hung_url: str) -> None:
    endpoint = ChatEndpoint(hung_url, "scripted", None, timeout_s=120, max_retries=4)
    calls = Calls()
    thread, outcome = ask_in_thread(endpoint, calls)
    time.sleep(1.0)
    assert thread.is_alive() and not calls.answered  # waiting for a reply that never comes
    cut_at = time.monotonic()
    calls.cut()
    thread.join(10)
    assert not thread.is_alive(), "the request went on after the cut"
    assert time.monotonic() - cut_at < 5
    (error,) = outcome
    assert isinstance(error, ModelUnavailableError)
    assert str(error) == f"{hung_url}: the request was cut: the run is stopping"  # not retried 4 times


@pytest.mark.timeout(60)
def test_a_retry_backoff_ends_when_the_calls_are_cut() -> None:
    with socket.socket() as placeholder:  # connection refused: the client backs off 30 s before its retry
        placeholder.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{placeholder.getsockname()[1]}/v1"
    endpoint = ChatEndpoint(url, "scripted", None, timeout_s=5, max_retries=3, backoff_s=30)
    calls = Calls()
    thread, outcome = ask_in_thread(endpoint, calls)
    time.sleep(1.0)
    calls.cut()
    thread.join(10)
    assert not thread.is_alive()
    (error,) = outcome
    assert isinstance(error, ModelUnavailableError) and "not retried: the run is stopping" in str(error)


@pytest.mark.timeout(60)
def test_cut_calls_refuse_new_requests_until_allowed_and_replies_count_as_answers(chat_server: ChatServer) -> None:
    chat_server.script(lambda request: "submit")
    agent = LLMAgent(base_url=chat_server.base_url, model="scripted", api_key_env="", max_retries=0)
    probe = agent.endpoint_probe()
    endpoint = ChatEndpoint(chat_server.base_url, "scripted", None, max_retries=0)
    agent.cut_calls()
    with pytest.raises(ModelUnavailableError, match="the request was cut: the run is stopping"):
        complete(endpoint, MESSAGES, calls=agent._calls)
    assert not chat_server.completions()  # nothing was sent
    assert not probe.has_answered
    agent.allow_calls()
    assert complete(endpoint, MESSAGES, calls=agent._calls).content == "submit"
    assert probe.has_answered  # the agent's reply counts for the runner's first-contact watch


@pytest.fixture
def hung_tls_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An HTTPS endpoint (a test CA the client trusts) that completes the TLS handshake and never answers."""
    ca = TestCA(tmp_path / "ca")
    issued = ca.issue(["127.0.0.1"])
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.cert_path))
    context = tls_context(str(issued.cert_path), str(issued.key_path))
    held: list[ssl.SSLSocket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)

        def accept() -> None:
            with contextlib.suppress(OSError):
                while True:
                    conn, _ = listener.accept()
                    held.append(context.wrap_socket(conn, server_side=True))  # handshake done, nothing read

        threading.Thread(target=accept, daemon=True).start()
        yield f"https://127.0.0.1:{listener.getsockname()[1]}/v1"
    for sock in held:
        sock.close()


@pytest.mark.timeout(60)
def test_a_request_over_tls_waiting_on_a_hung_endpoint_ends_when_the_calls_are_cut(hung_tls_url: str) -> None:
    endpoint = ChatEndpoint(hung_tls_url, "scripted", None, timeout_s=120, max_retries=4)
    calls = Calls()
    thread, outcome = ask_in_thread(endpoint, calls)
    time.sleep(1.0)
    assert thread.is_alive() and not calls.answered and not outcome  # the handshake held: waiting for a reply
    calls.cut()
    thread.join(10)
    assert not thread.is_alive(), "the request over TLS went on after the cut"
    (error,) = outcome
    assert isinstance(error, ModelUnavailableError) and "the request was cut" in str(error)

"""The gateway's API key, with the real `openai` client against a real gateway (uvicorn) in front of no server:
the key is checked before anything reaches Triton, so an unreachable Triton keeps these tests server-free."""

import json
import urllib.error
import urllib.request

import openai
import pytest

from tritonforge.facts.environment import API_KEY_ENV
from tritonforge.gateway.options import GatewayThread, api_key_from_environment
from tritonforge.gateway.routes import authorized
from tritonforge.serve.ports import free_port

KEY = "sk-test-7f3a"
MODEL = "tiny"


@pytest.fixture(scope="module")
def gateway():
    # Nothing listens on this port: /health then answers 503, and every other request needs no server to be
    # told apart by its key (/v1/models answers from the gateway itself).
    nowhere = f"127.0.0.1:{free_port()}"
    gateway = GatewayThread(nowhere, port=free_port(), served_model_name=MODEL, api_key=KEY).start()
    yield gateway
    gateway.stop()


def _client(gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)


def _get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_the_right_key_is_served(gateway):
    assert [model.id for model in _client(gateway, KEY).models.list()] == [MODEL]


def test_a_wrong_key_gets_401_with_openais_error_object(gateway):
    with pytest.raises(openai.AuthenticationError) as caught:
        _client(gateway, "sk-wrong").models.list()
    assert caught.value.status_code == 401
    error = caught.value.body
    assert error["type"] == "invalid_request_error" and "API key" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_a_missing_key_gets_401_on_every_endpoint_but_health(gateway):
    for path in ("/v1/models", "/metrics", "/v1/no-such-endpoint", "/docs"):
        status, body = _get(gateway.base_url + path)
        assert status == 401, path
        assert json.loads(body)["error"]["type"] == "invalid_request_error", path
    for path in ("/v1/completions", "/v1/chat/completions"):  # the openai client refuses to send no key
        request = urllib.request.Request(gateway.base_url + path, data=b'{"prompt": "Hi"}', method="POST",
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 401 and caught.value.headers["WWW-Authenticate"] == "Bearer", path
    # /health needs no key: it tells the truth about Triton, which is not there.
    assert _get(gateway.base_url + "/health")[0] == 503


def test_a_wrong_key_gets_401_before_a_generation_or_stream_starts(gateway):
    client = _client(gateway, "sk-wrong")
    with pytest.raises(openai.AuthenticationError):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True)


def test_the_key_also_opens_metrics(gateway):
    status, body = _get(gateway.base_url + "/metrics", {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and b"tritonforge_requests_total" in body


def test_without_a_key_nothing_is_refused():
    nowhere = f"127.0.0.1:{free_port()}"
    gateway = GatewayThread(nowhere, port=free_port(), served_model_name=MODEL).start()
    try:
        assert [model.id for model in _client(gateway, "anything").models.list()] == [MODEL]
        assert _get(gateway.base_url + "/metrics")[0] == 200
    finally:
        gateway.stop()


def test_the_key_comes_from_the_environment_unless_given(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "from-secret")
    assert api_key_from_environment(None) == "from-secret"
    assert api_key_from_environment("given") == "given"
    monkeypatch.setenv(API_KEY_ENV, "")
    assert api_key_from_environment(None) is None  # an empty Secret value is no key, not the empty key
    monkeypatch.delenv(API_KEY_ENV)
    assert api_key_from_environment(None) is None


@pytest.mark.parametrize("header, expected", [
    (f"Bearer {KEY}", True), (f"bearer {KEY}", True), (f"Bearer  {KEY} ", True),
    (f"Bearer {KEY}x", False), (KEY, False), (f"Basic {KEY}", False), ("", False), (None, False),
])
def test_only_a_bearer_header_with_the_exact_key_is_authorized(header, expected):
    assert authorized(header, KEY) is expected

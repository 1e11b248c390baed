"""Signed records and bounded bookkeeping on the experience queue (issue 26), on a real Redis."""

import pytest

from shared.experience_queue import ProcessedIds, StreamQueue
from shared.redact import redact_text, redact_url
from shared.schemas import PromptTask
from shared.signing import RecordSigner, signer_for

KEY = "a-run-key-of-32-characters-long!"


def test_signatures_bind_the_key_the_stream_and_the_bytes():
    s = RecordSigner(KEY)
    sig = s.sign("fleetrl:r:prompts", b"payload")
    assert s.problem("fleetrl:r:prompts", b"payload", sig) is None
    assert "bad signature" in s.problem("fleetrl:r:prompts", b"payload!", sig)
    assert "bad signature" in s.problem("fleetrl:other:prompts", b"payload", sig)  # replayed into another run
    assert "bad signature" in RecordSigner(KEY[::-1]).problem("fleetrl:r:prompts", b"payload", sig)
    assert "unsigned" in s.problem("fleetrl:r:prompts", b"payload", None)
    with pytest.raises(ValueError, match="16 bytes"):
        RecordSigner("short")
    assert signer_for(None) is None


async def test_a_worker_dead_letters_a_prompt_without_the_run_keys_signature(redis_client):
    """What a rollout worker does with a prompt task someone wrote to Redis: dead-letter it with the reason,
    count it, never hand it out (so it is never run)."""
    signed = StreamQueue(redis_client, "fleetrl:r:prompts", "rollout", PromptTask, signer=RecordSigner(KEY))
    forger = StreamQueue(redis_client, "fleetrl:r:prompts", "rollout", PromptTask)
    other = StreamQueue(redis_client, "fleetrl:r:prompts", "rollout", PromptTask, signer=RecordSigner(KEY[::-1]))
    await signed.produce(PromptTask(id="good", prompt="hi"))
    await forger.produce(PromptTask(id="forged", prompt="hi", metadata={"environment": "subprocess:Popen"}))
    await other.produce(PromptTask(id="other-run", prompt="hi"))
    got = await signed.consume("w", count=10, block_ms=10)
    assert [d.record.id for d in got] == ["good"]
    assert signed.rejected_signature == 2 and (await signed.stats()).rejected_signature == 2
    errors = sorted(d["error"] for d in await signed.dead_letters())
    assert errors[0].startswith("signature: bad signature") and errors[1].startswith("signature: unsigned")
    # a consumer without a key (tooling, tests) still reads signed entries
    reader = StreamQueue(redis_client, "s2", "g", PromptTask)
    await StreamQueue(redis_client, "s2", "g", PromptTask, signer=RecordSigner(KEY)).produce(PromptTask(id="x", prompt="p"))
    assert [d.record.id for d in await reader.consume("c", block_ms=10)] == ["x"]


async def test_dead_letter_streams_are_trimmed_to_about_their_maxlen(redis_client):
    q = StreamQueue(redis_client, "s", "g", PromptTask, dead_letter_maxlen=100)
    for i in range(1000):
        await redis_client.xadd("s", {b"p": b"not msgpack"})
    while await q.consume("c", count=200, block_ms=10) or (await q.stats()).backlog:
        pass
    dead = await redis_client.xlen(q.dead_stream)
    assert q._counters.dead_lettered == 1000 and dead <= 300, dead  # approximate: whole macro nodes are trimmed


async def test_processed_ids_expire_and_are_capped(redis_client):
    ids = ProcessedIds(redis_client, "seen", max_ids=10, ttl_s=3600)
    await ids.mark([f"s{i}" for i in range(25)])
    assert await ids.count() == 10 and ids.evicted == 15
    assert 0 < await redis_client.ttl("seen") <= 3600
    pipe = redis_client.pipeline(transaction=True)
    await ids.mark(["late"], pipe=pipe)  # with the caller's pipeline: marked and expiring in the same MULTI
    await pipe.execute()
    assert await ids.filter_new(["late", "new"]) == ["new"]


def test_credentials_never_show():
    assert redact_url("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("rediss://user:s3cret@[::1]:6380/2") == "rediss://user:***@[::1]:6380/2"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url(None) is None
    assert "s3cret" not in redact_text("Error connecting to redis://:s3cret@h:1/0 and redis://u:s3cret@h2/1")


def test_redis_url_accepts_tls_and_passwords_and_a_bad_one_is_named_without_its_password(monkeypatch):
    from shared.settings import ServiceSettings, SettingsError, load_settings

    monkeypatch.delenv("REDIS_URL", raising=False)
    for url in ("rediss://:pw@redis.example:6380/0", "redis://:pw@127.0.0.1:6379/0", "unix:///run/redis.sock"):
        assert load_settings(ServiceSettings, redis_url=url).redis_url == url
    with pytest.raises(SettingsError) as err:
        load_settings(ServiceSettings, redis_url="http://:hunter2hunter2@h:1/0")
    assert "redis_url" in str(err.value) and "rediss://" in str(err.value) and "hunter2" not in str(err.value)
    with pytest.raises(SettingsError, match="run_key.*16 characters"):
        load_settings(ServiceSettings, run_key="short")


async def test_a_rediss_url_reaches_redis_py_as_tls():
    """redis-py takes rediss:// as TLS: our settings pass the URL through as it is (no scheme rewriting)."""
    import redis.asyncio as aioredis

    client = aioredis.from_url("rediss://:pw@127.0.0.1:1/0")
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class.__name__ == "SSLConnection" and kwargs["password"] == "pw"
    await client.aclose()

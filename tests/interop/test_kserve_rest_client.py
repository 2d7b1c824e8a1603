"""KServe's V2 REST client (``kserve.InferenceRESTClient``) against binproto's
reference servers: the health and readiness answers it reads."""

from __future__ import annotations

import asyncio

import pytest

kserve = pytest.importorskip("kserve")


async def _answers(port: int) -> tuple[bool, bool, bool]:
    from kserve.inference_client import RESTConfig

    client = kserve.InferenceRESTClient(RESTConfig(protocol="v2", timeout=10))
    url = f"http://127.0.0.1:{port}"
    try:
        return (
            await client.is_server_live(url),
            await client.is_server_ready(url),
            await client.is_model_ready(url, "echo"),
        )
    finally:
        await client.close()


def test_kserve_reads_the_health_and_readiness_answers(binproto_server: tuple[str, int]) -> None:
    # KServe's client reads the JSON field ({"live": true}, ...): an empty
    # body, enough for tritonclient, was a JSONDecodeError there.
    _, port = binproto_server
    assert asyncio.run(asyncio.wait_for(_answers(port), 30)) == (True, True, True)

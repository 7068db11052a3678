"""The Ray serving parts that need no cluster: prefix hashing, metrics merging, flag checks."""
from __future__ import annotations

import json

import pytest

from shrike.cli import main
from shrike.server.ray.metrics_merge import merge_expositions
from shrike.server.ray.prefix import BLOCK_CHARS, prefix_hashes


def chat_body(*messages: tuple[str, str]) -> bytes:
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in messages]}).encode()


def test_prompts_sharing_whole_blocks_share_those_hashes_and_no_more():
    system = "s" * (3 * BLOCK_CHARS)
    a = prefix_hashes("/v1/chat/completions", chat_body(("system", system), ("user", "a" * BLOCK_CHARS)))
    b = prefix_hashes("/v1/chat/completions", chat_body(("system", system), ("user", "b" * BLOCK_CHARS)))
    assert len(a) == len(b) == 4
    assert a[:3] == b[:3] and a[3] != b[3]
    # A change in the first block changes every hash after it: hashes cover the whole prefix.
    c = prefix_hashes("/v1/chat/completions", chat_body(("system", "t" + system[1:]), ("user", "a" * BLOCK_CHARS)))
    assert not set(a) & set(c)


def test_completion_prompts_text_ids_and_batches_hash_their_first_prompt():
    text = "word " * 100
    single = prefix_hashes("/v1/completions", json.dumps({"prompt": text}).encode())
    batch = prefix_hashes("/v1/completions", json.dumps({"prompt": [text, "other"]}).encode())
    assert single and single == batch
    ids = prefix_hashes("/v1/completions", json.dumps({"prompt": list(range(40))}).encode())
    assert ids and ids == prefix_hashes("/v1/completions", json.dumps({"prompt": [list(range(40))]}).encode())


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", b"{not json"), ("/v1/completions", b"[1, 2]"),
                                        ("/v1/completions", json.dumps({"prompt": "short"}).encode()),
                                        ("/tokenize", json.dumps({"prompt": "x" * 1000}).encode())])
def test_bodies_without_a_routable_prompt_get_no_prefix(path, body):
    assert prefix_hashes(path, body) == ()


def test_merged_metrics_group_each_family_and_label_every_sample():
    replica_a = ('# HELP shrike:hits Hits.\n# TYPE shrike:hits counter\nshrike:hits{model_name="m"} 3.0\n'
                 '# HELP shrike:ttft TTFT.\n# TYPE shrike:ttft histogram\nshrike:ttft_bucket{le="+Inf"} 1\n'
                 'shrike:ttft_sum 0.5\n')
    replica_b = '# HELP shrike:hits Hits.\n# TYPE shrike:hits counter\nshrike:hits{model_name="m"} 5.0\n'
    merged = merge_expositions({"a": replica_a, "b": replica_b}).splitlines()
    assert merged == ["# HELP shrike:hits Hits.", "# TYPE shrike:hits counter",
                      'shrike:hits{replica="a",model_name="m"} 3.0', 'shrike:hits{replica="b",model_name="m"} 5.0',
                      "# HELP shrike:ttft TTFT.", "# TYPE shrike:ttft histogram",
                      'shrike:ttft_bucket{replica="a",le="+Inf"} 1', 'shrike:ttft_sum{replica="a"} 0.5']


@pytest.mark.parametrize("flags, message", [
    (["--num-replicas", "2"], "--num-replicas needs --ray"),
    (["--ray", "--cpu-bind", "0"], "--cpu-bind does not apply with --ray"),
    (["--ray", "--header-timeout", "5"], "--header-timeout does not apply with --ray"),
    (["--ray", "--num-replicas", "2", "--max-replicas", "3"], "either --num-replicas or --min-replicas"),
    (["--ray", "--min-replicas", "3", "--max-replicas", "2"], "--min-replicas 3 is above --max-replicas 2"),
    (["--ray", "--target-ongoing-requests", "4"], "--target-ongoing-requests needs"),
    (["--ray", "--cpus-per-replica", "2", "--cpu-threads", "3"], "--cpu-threads 3 must be between 1 and"),
    (["--ray", "--ray-address", "127.0.0.1:1"], "cannot reach the Ray cluster at 127.0.0.1:1"),
])
def test_flags_that_cannot_work_get_one_line(flags, message, capsys):
    assert main(["serve", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", b'{"prompt": 5}', "prompt"),
    ("/v1/chat/completions", b'{"messages": "hi"}', "messages"),
    ("/v1/completions", b"{not json", None),
    ("/tokenize", b'{"prompt": "x", "add_special_tokens": "yes"}', "add_special_tokens"),
])
def test_a_full_cluster_still_refuses_a_malformed_body_with_its_400(path, body, param):
    from shrike.server.ray.ingress import _malformed
    refusal = _malformed({"method": "POST", "path": path, "body": body})
    assert refusal.status == 400 and refusal.param == param, refusal.body()
    assert _malformed({"method": "POST", "path": "/v1/completions", "body": b'{"prompt": "Hi"}'}) is None

"""Capabilities match what is answered (over stdio, through the official SDK): no prompts
and no completions are declared, so `prompts/list`, `prompts/get` and
`completion/complete` are -32601; a resource that is not found is -32002 with the URI in
`data.uri`, whether the URI is malformed or names a job that does not exist."""

from __future__ import annotations

from mcp import MCPError, types


async def expect_error(call, code: int) -> MCPError:
    try:
        await call
    except MCPError as e:
        assert e.code == code, (e.code, e.message)
        return e
    raise AssertionError(f"answered instead of error {code}")


def test_prompts_and_completions_are_neither_declared_nor_answered(server):
    async def scenario(c):
        caps = c.session.server_capabilities
        assert caps.prompts is None and caps.completions is None, caps
        e = await expect_error(c.session.list_prompts(), -32601)
        assert "prompts" in e.message, e.message
        await expect_error(c.session.get_prompt("anything"), -32601)
        ref = types.ResourceTemplateReference(type="ref/resource", uri="job://{job_id}/stdout")
        e = await expect_error(c.session.complete(ref, {"name": "job_id", "value": "j"}), -32601)
        assert "completion" in e.message, e.message

    server.run(scenario)


def test_resource_not_found_names_the_uri_in_data(server):
    async def scenario(c):
        for uri in ("job://no-such-job/stdout", "job://j1/stdin", "session://nobody/history", "script://j404"):
            e = await expect_error(c.session.read_resource(uri), -32002)
            assert e.data == {"uri": uri}, (uri, e.data, e.message)

    server.run(scenario)

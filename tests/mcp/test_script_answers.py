"""A `python_run_script` answer names the Python it ran on and what its environment
resolved to, in words and in its structured result."""

from conftest import make_wheel, uv_offline


def test_a_script_answer_names_its_python_and_resolved_dependencies(server):
    wheels = server.root / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "sixish", "1.2.3")
    uv_offline(server, wheels)

    async def scenario(c):
        res = await c.call("python_run_script", code="import sixish\nprint('ok')", dependencies=["sixish"], wait_seconds=60)
        job = await c.finish(res.structured_content, timeout=180)
        assert job["status"] == "completed", job
        result = job["result"]
        assert result["python"].count(".") == 2 and result["python"].startswith("3."), result
        assert result["resolved"] == ["sixish==1.2.3"], result
        assert f"ran on Python {result['python']} with sixish==1.2.3" in (job.get("message") or ""), job
        # Without dependencies: the REPL's interpreter, named too.
        res = await c.call("python_run_script", code="print(2)", wait_seconds=60)
        bare = await c.finish(res.structured_content, timeout=120)
        assert bare["result"]["python"] == result["python"] or bare["result"]["python"].startswith("3."), bare
        assert "resolved" not in bare["result"], bare

    server.run(scenario)

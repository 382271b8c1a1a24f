//! The shipped policies (`policies/*.toml`, their one source of truth) also as JSON in
//! `OUT_DIR`, for `Policy::load` to read at run time: the same document, parsed several
//! times faster than its TOML (a `run` parses one on its way to the fork). The policy
//! tests check that both parse to the same policy.

use std::error::Error;
use std::path::Path;

fn main() -> Result<(), Box<dyn Error>> {
    let out = std::env::var_os("OUT_DIR").ok_or("cargo sets OUT_DIR for build scripts")?;
    println!("cargo::rerun-if-changed=policies");
    let mut files = Vec::new();
    for entry in std::fs::read_dir("policies")? {
        let path = entry?.path();
        if path.extension().is_some_and(|x| x == "toml") {
            files.push(path);
        }
    }
    files.sort();
    for path in files {
        println!("cargo::rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path)?;
        let value: toml::Value =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path.file_stem().ok_or("a policy file has a name")?;
        std::fs::write(
            Path::new(&out).join(name).with_extension("json"),
            serde_json::to_string(&value)?,
        )?;
    }
    Ok(())
}

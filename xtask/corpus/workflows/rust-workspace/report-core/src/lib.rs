//! The workspace's library: which `KEY=value` lines name a version requirement.

/// The keys of `.env` lines whose value parses as a semver requirement.
///
/// ```
/// assert_eq!(report_core::version_keys("NODE=^20\nTOKEN=x y\n"), ["NODE"]);
/// ```
pub fn version_keys(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(_, value)| semver::VersionReq::parse(value.trim()).is_ok())
        .map(|(key, _)| key.trim())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_project_env() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../.env")).unwrap();
        assert!(super::version_keys(&text).contains(&"NODE_VERSION"));
    }
}

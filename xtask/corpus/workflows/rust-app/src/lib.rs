//! The developer's own code: it reads the project's `.env` and the AWS credentials file, as a
//! tool that talks to AWS does, and reports what it found (never the values).

use serde::Serialize;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Report {
    pub env_keys: usize,
    pub aws_profiles: usize,
}

/// Counts `KEY=value` lines.
///
/// ```
/// assert_eq!(cred_report::count_keys("A=1\n# c\nB=2\n"), 2);
/// ```
pub fn count_keys(text: &str) -> usize {
    text.lines().filter(|line| !line.trim_start().starts_with('#') && line.contains('=')).count()
}

/// Counts `[profile]` headers.
///
/// ```
/// assert_eq!(cred_report::count_profiles("[default]\nk = v\n[work]\n"), 2);
/// ```
pub fn count_profiles(text: &str) -> usize {
    text.lines().filter(|line| line.trim_start().starts_with('[')).count()
}

pub fn read(path: &Path) -> Result<String, ReportError> {
    std::fs::read_to_string(path).map_err(|source| ReportError::Read { path: path.display().to_string(), source })
}

/// The report of the `.env` in `project` and `~/.aws/credentials`.
pub fn report(project: &Path, home: &Path) -> Result<Report, ReportError> {
    Ok(Report {
        env_keys: count_keys(&read(&project.join(".env"))?),
        aws_profiles: count_profiles(&read(&home.join(".aws/credentials"))?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_the_real_files() {
        let home = std::env::var_os("HOME").expect("HOME is set");
        let report = report(Path::new(env!("CARGO_MANIFEST_DIR")), Path::new(&home)).unwrap();
        assert!(report.env_keys >= 1 && report.aws_profiles >= 1, "{report:?}");
    }
}

//! The traced host's passwd file (`--passwd FILE`): homes by uid, for traces whose events carry
//! no `HOME`. Read as given (never this machine's `/etc/passwd` unless that is the file named).

use std::{collections::HashMap, path::Path};

use super::ImportError;

/// Most lines read: a passwd file is small; anything larger is not one.
const MAX_LINES: u64 = 1 << 20;

/// Homes by uid from `path`: `name:password:uid:gid:gecos:home:shell` lines; empty lines and
/// `#` comments are skipped. The first entry of a uid wins (as for getpwuid). Errors name the
/// file and line.
pub fn read(path: &Path) -> Result<HashMap<u32, String>, ImportError> {
    let file = path.display().to_string();
    let text = std::fs::read(path).map_err(|e| ImportError::fatal(&file, format!("cannot read: {e}")))?;
    parse(&file, &String::from_utf8_lossy(&text))
}

/// As [`read`], over the text of `file`.
pub fn parse(file: &str, text: &str) -> Result<HashMap<u32, String>, ImportError> {
    let mut homes = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let number = index as u64 + 1;
        if number > MAX_LINES {
            return Err(ImportError::fatal(file, format!("more than {MAX_LINES} lines: not a passwd file")));
        }
        let bad = |message: String| ImportError { recoverable: false, ..ImportError::bad_line(file, number, message) };
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() != 7 {
            return Err(bad(format!("{} fields, a passwd line has 7 (name:x:uid:gid:gecos:home:shell)", fields.len())));
        }
        let uid: u32 = fields[2].parse().map_err(|_| bad(format!("uid {:?} is not a number", fields[2])))?;
        let home = fields[5];
        if !home.starts_with('/') {
            return Err(bad(format!("home {home:?} is not an absolute path")));
        }
        homes.entry(uid).or_insert_with(|| crate::event::normalize_path(home));
    }
    Ok(homes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_homes_by_uid() {
        let text = "# comment\nroot:x:0:0:root:/root:/bin/bash\n\njenkins:x:112:118:Jenkins,,,:/var/lib/jenkins:/bin/bash\ndup:x:112:1::/elsewhere:/bin/sh\n";
        let homes = parse("passwd", text).unwrap();
        assert_eq!(homes.get(&0).map(String::as_str), Some("/root"));
        assert_eq!(homes.get(&112).map(String::as_str), Some("/var/lib/jenkins"));
        assert_eq!(homes.len(), 2);
    }

    #[test]
    fn bad_lines_name_file_and_line() {
        let cases = [
            ("root:x:0:0:root:/root:/bin/bash\njenkins:x:112\n", 2, "3 fields"),
            ("a:x:0:0::/root:/bin/sh\nb:x:abc:0::/h:/bin/sh\n", 2, "uid \"abc\" is not a number"),
            ("\n\nc:x:5:5::relative:/bin/sh\n", 3, "not an absolute path"),
        ];
        for (text, line, message) in cases {
            let error = parse("hosts/passwd", text).unwrap_err();
            assert_eq!((error.file.as_str(), error.line), ("hosts/passwd", Some(line)), "{error}");
            assert!(error.to_string().starts_with(&format!("hosts/passwd:{line}: ")), "{error}");
            assert!(error.message.contains(message), "{error}");
        }
    }
}

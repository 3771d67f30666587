//! The traced host's passwd file (`--passwd FILE`): homes by uid, for traces whose events carry
//! no `HOME`. Read as given (never this machine's `/etc/passwd` unless that is the file named).
//! Also a user's account and groups for `credwatch exposure --user` (this machine's
//! `/etc/passwd` and `/etc/group`).

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
    for account in accounts(file, text)? {
        homes.entry(account.uid).or_insert(account.home);
    }
    Ok(homes)
}

/// One line of a passwd file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

/// Every account of the passwd text of `file`, in order: `name:password:uid:gid:gecos:home:shell`
/// lines; empty lines and `#` comments are skipped. Errors name the file and line.
pub fn accounts(file: &str, text: &str) -> Result<Vec<Account>, ImportError> {
    let mut out = Vec::new();
    for_each_record(file, text, "passwd", "name:x:uid:gid:gecos:home:shell", |fields, bad| {
        let uid: u32 = fields[2].parse().map_err(|_| bad(format!("uid {:?} is not a number", fields[2])))?;
        let gid: u32 = fields[3].parse().map_err(|_| bad(format!("gid {:?} is not a number", fields[3])))?;
        let home = fields[5];
        if !home.starts_with('/') {
            return Err(bad(format!("home {home:?} is not an absolute path")));
        }
        out.push(Account { name: fields[0].to_owned(), uid, gid, home: crate::event::normalize_path(home) });
        Ok(())
    })?;
    Ok(out)
}

/// The groups `user` is a member of by the group text of `file` (`name:password:gid:user,user`
/// lines), besides its primary group. Errors name the file and line.
pub fn member_of(file: &str, text: &str, user: &str) -> Result<Vec<u32>, ImportError> {
    let mut gids = Vec::new();
    for_each_record(file, text, "group", "name:x:gid:members", |fields, bad| {
        let gid: u32 = fields[2].parse().map_err(|_| bad(format!("gid {:?} is not a number", fields[2])))?;
        if fields[3].split(',').any(|member| member == user) && !gids.contains(&gid) {
            gids.push(gid);
        }
        Ok(())
    })?;
    Ok(gids)
}

/// Calls `record` with the colon-separated fields of each line of the `kind` file `file` (a
/// line's fields named by `shape`, whose field count every line must have), and with the error
/// of that line; empty lines and `#` comments are skipped.
fn for_each_record(
    file: &str,
    text: &str,
    kind: &str,
    shape: &str,
    mut record: impl FnMut(&[&str], &dyn Fn(String) -> ImportError) -> Result<(), ImportError>,
) -> Result<(), ImportError> {
    let arity = shape.split(':').count();
    for (index, line) in text.lines().enumerate() {
        let number = index as u64 + 1;
        if number > MAX_LINES {
            return Err(ImportError::fatal(file, format!("more than {MAX_LINES} lines: not a {kind} file")));
        }
        let bad = |message: String| ImportError { recoverable: false, ..ImportError::bad_line(file, number, message) };
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() != arity {
            return Err(bad(format!("{} fields, a {kind} line has {arity} ({shape})", fields.len())));
        }
        record(&fields, &bad)?;
    }
    Ok(())
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
            ("d:x:6:six::/h:/bin/sh\n", 1, "gid \"six\" is not a number"),
        ];
        for (text, line, message) in cases {
            let error = parse("hosts/passwd", text).unwrap_err();
            assert_eq!((error.file.as_str(), error.line), ("hosts/passwd", Some(line)), "{error}");
            assert!(error.to_string().starts_with(&format!("hosts/passwd:{line}: ")), "{error}");
            assert!(error.message.contains(message), "{error}");
        }
    }

    #[test]
    fn accounts_and_groups_of_a_user() {
        let accounts =
            accounts("passwd", "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice/:/bin/sh\n").unwrap();
        assert_eq!(accounts[1], Account { name: "alice".into(), uid: 1000, gid: 1000, home: "/home/alice".into() });
        let group = "root:x:0:\nsudo:x:27:bob,alice\nalice:x:1000:\ndocker:x:999:alicex\n# c\nadm:x:4:alice\n";
        assert_eq!(member_of("group", group, "alice").unwrap(), [27, 4]);
        let error = member_of("etc/group", "a:x:1:\nb:x:2\n", "alice").unwrap_err();
        assert!(error.to_string().starts_with("etc/group:2: "), "{error}");
        let error = member_of("etc/group", "a:x:one:\n", "alice").unwrap_err();
        assert!(error.to_string().contains("gid \"one\""), "{error}");
    }
}

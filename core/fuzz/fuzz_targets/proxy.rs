//! `run --contain-net`'s proxy on a fuzzed request head, as package code in the box sends it:
//! `request_head` on the bytes as they arrive (a prefix, then the whole), then what the proxy
//! does with a head: the allow decision against the default rules' registries and a configured
//! one, the head sent on (origin form and absolute), or the refusal's response; and the same
//! bytes as an npmrc and a configured URL, which come from the user's files and environment.
#![no_main]

use std::{ffi::OsStr, sync::OnceLock};

use credwatch_core::{
    contain::net::{configured_urls, endpoint, npmrc_registries, request_head, response, Allowed},
    rules::RuleSet,
};
use libfuzzer_sys::fuzz_target;

fn allowed() -> &'static Allowed {
    static ALLOWED: OnceLock<Allowed> = OnceLock::new();
    ALLOWED.get_or_init(|| {
        let rules = RuleSet::defaults().expect("the default rules load");
        let env = [(OsStr::new("npm_config_registry"), OsStr::new("http://127.0.0.10:4873/"))];
        Allowed::new(&rules, env, &["registry=https://npm.example.test/\n".to_owned()])
    })
}

fuzz_target!(|data: &[u8]| {
    for bytes in [&data[..data.len() / 2], data] {
        match request_head(bytes) {
            Ok(Some(head)) => {
                assert!(head.length <= bytes.len(), "a head longer than its bytes");
                let _ = allowed().allows(head.target.endpoint());
                let _ = (head.forwarded(false), head.forwarded(true));
            }
            Ok(None) => {}
            Err(error) => {
                let refusal = response(error.status(), &error.to_string());
                assert!(refusal.starts_with(b"HTTP/1.1 "), "a refusal that is no response");
            }
        }
    }
    let text = String::from_utf8_lossy(data);
    for url in
        npmrc_registries(&text).into_iter().chain(configured_urls(OsStr::new("PIP_INDEX_URL"), OsStr::new(&*text)))
    {
        let _ = endpoint(&url).map(|to| to.authority());
    }
});

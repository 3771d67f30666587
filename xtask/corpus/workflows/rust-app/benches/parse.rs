// A plain benchmark (no harness: stable Rust) timing the parsers on the real files.
fn main() {
    let home = std::env::var_os("HOME").expect("HOME is set");
    let text = cred_report::read(&std::path::Path::new(&home).join(".aws/credentials")).unwrap();
    let started = std::time::Instant::now();
    let mut profiles = 0;
    for _ in 0..10_000 {
        profiles += cred_report::count_profiles(std::hint::black_box(&text));
    }
    println!("count_profiles: {:?} per call ({profiles})", started.elapsed() / 10_000);
}

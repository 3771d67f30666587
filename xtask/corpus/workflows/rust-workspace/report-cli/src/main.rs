fn main() {
    let text = std::fs::read_to_string(".env").expect("a .env in the workspace");
    let home = std::env::var("HOME").expect("HOME is set");
    let aws = std::fs::read_to_string(format!("{home}/.aws/credentials")).unwrap_or_default();
    println!("{:?}; {} bytes of AWS credentials", report_core::version_keys(&text), aws.len());
}

fn main() {
    std::process::exit(kavi::cli::main());
}

//! Compiles the generated parser (`src/parser.c`, committed; `tree-sitter
//! generate` rewrites it from `grammar.js`) and its external scanner
//! (`src/scanner.c`, hand-written) into this crate.

fn main() {
    let src = std::path::Path::new("src");
    cc::Build::new()
        .std("c11")
        .include(src)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-unused-but-set-variable")
        .file(src.join("parser.c"))
        .file(src.join("scanner.c"))
        .compile("tree-sitter-shard");
    println!("cargo:rerun-if-changed=src/parser.c");
    println!("cargo:rerun-if-changed=src/scanner.c");
    println!("cargo:rerun-if-changed=src/tree_sitter/parser.h");
}

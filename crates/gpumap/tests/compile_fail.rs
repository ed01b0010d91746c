//! What must not compile: views that outlive or alias their memory, writes through read views,
//! raw addresses without `unsafe`. Each case's expected error is in its `.stderr` file
//! (regenerate with `TRYBUILD=overwrite` after checking the new message is the same error).

#[test]
fn unsound_uses_do_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile_fail/*.rs");
}

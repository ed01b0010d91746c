//! RemotePrefix against the S3-compatible responder on 127.0.0.1 (tests/remote/server.rs):
//! listings page by page and level by level, retried from where a failed page left off; sizes,
//! reads and writes of named objects through the prefix's client; batched deletes; names that
//! could leave the prefix refused before any request.
#![cfg(feature = "remote")]

mod common;
#[allow(dead_code)] // Not every helper of the server is used here.
#[path = "remote/server.rs"]
mod server;

use std::time::Duration;

use gpumap::error::{Error, RemoteErrorKind};
use gpumap::remote::{RemoteEntry, RemoteOptions, RemotePrefix};
use server::{aws_environment, Fault, Server, KEY_ID};

/// Objects `(path under the bucket, size)` every test starts from: a prefix `data/` with
/// levels, and neighbours it must not list (`datax/` shares its first letters).
const LAYOUT: &[(&str, usize)] = &[
    ("data/a.bin", 3),
    ("data/sub/b.bin", 5),
    ("data/sub/c/d.bin", 7),
    ("data/z.json", 11),
    ("datax/e.bin", 13),
    ("other/f.bin", 17),
];

fn server() -> Server {
    aws_environment();
    let server = Server::s3(KEY_ID);
    for &(path, len) in LAYOUT {
        server.put(&format!("/test-bucket/{path}"), common::random_bytes(len, len as u64));
    }
    server
}

fn options(server: &Server) -> RemoteOptions {
    let mut options = RemoteOptions::default();
    options.backoff(Duration::from_millis(5), Duration::from_millis(20));
    options.s3_endpoint(Some(server.endpoint()));
    options
}

fn entry(name: &str, len: u64) -> RemoteEntry {
    RemoteEntry { name: name.to_owned(), len }
}

fn listed(prefix: &RemotePrefix, under: &str) -> Vec<RemoteEntry> {
    prefix.list(under).unwrap().collect::<gpumap::Result<Vec<_>>>().unwrap()
}

#[test]
fn listings_hold_the_prefixs_objects_alone_in_key_order_page_by_page() {
    let server = server();
    let data = RemotePrefix::open_with("s3://test-bucket/data/", &options(&server)).unwrap();
    let expected = vec![
        entry("a.bin", 3),
        entry("sub/b.bin", 5),
        entry("sub/c/d.bin", 7),
        entry("z.json", 11),
    ];
    assert_eq!(listed(&data, ""), expected);
    assert_eq!(server.lists(), 1);
    // Pages of two keys: the same listing, asked in two pages.
    server.list_page_size(2);
    assert_eq!(listed(&data, ""), expected);
    assert_eq!(server.lists(), 1 + 2);
    assert_eq!(listed(&data, "sub"), vec![entry("sub/b.bin", 5), entry("sub/c/d.bin", 7)]);
    assert_eq!(listed(&data, "sub/"), listed(&data, "sub"));
    assert_eq!(listed(&data, "none"), vec![]);
    // Without a trailing slash the same prefix; the whole bucket from its root.
    let same = RemotePrefix::open_with("s3://test-bucket/data", &options(&server)).unwrap();
    assert_eq!(listed(&same, ""), expected);
    let bucket = RemotePrefix::open_with("s3://test-bucket", &options(&server)).unwrap();
    let all: Vec<String> = listed(&bucket, "").into_iter().map(|e| e.name).collect();
    let want: Vec<String> = LAYOUT.iter().map(|(p, _)| p.to_string()).collect();
    assert_eq!(all, want);
}

#[test]
fn a_directory_listing_shows_one_level() {
    let server = server();
    server.list_page_size(1);
    let data = RemotePrefix::open_with("s3://test-bucket/data/", &options(&server)).unwrap();
    let top = data.list_dir("").unwrap();
    assert_eq!(top.objects, vec![entry("a.bin", 3), entry("z.json", 11)]);
    assert_eq!(top.dirs, vec!["sub".to_owned()]);
    let sub = data.list_dir("sub/").unwrap();
    assert_eq!(sub.objects, vec![entry("sub/b.bin", 5)]);
    assert_eq!(sub.dirs, vec!["sub/c".to_owned()]);
    let empty = data.list_dir("nothing").unwrap();
    assert!(empty.objects.is_empty() && empty.dirs.is_empty());
}

#[test]
fn a_failed_page_is_asked_again_from_the_last_key_given() {
    let server = server();
    server.list_page_size(1);
    let data = RemotePrefix::open_with("s3://test-bucket/data/", &options(&server)).unwrap();
    let mut objects = data.list("").unwrap();
    assert_eq!(objects.next().unwrap().unwrap(), entry("a.bin", 3));
    // The next page fails twice (a 503, then a connection cut mid-body): asked a third time,
    // it goes on after a.bin, giving no key twice and skipping none.
    server.inject([Fault::Status(503), Fault::Truncate]);
    let rest: Vec<RemoteEntry> = objects.map(Result::unwrap).collect();
    assert_eq!(rest, vec![entry("sub/b.bin", 5), entry("sub/c/d.bin", 7), entry("z.json", 11)]);
    assert_eq!(server.lists(), 1 + 2 + 3);
}

#[test]
fn a_listing_that_keeps_failing_ends_with_a_typed_error_naming_the_prefix() {
    let server = server();
    let mut o = options(&server);
    o.max_attempts(2).unwrap();
    let data = RemotePrefix::open_with("s3://test-bucket/data/", &o).unwrap();
    server.inject([Fault::Status(503), Fault::Status(503)]);
    let mut objects = data.list("").unwrap();
    let e = objects.next().unwrap().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Remote { kind: RemoteErrorKind::Status, status: Some(503), attempts: 2, .. }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("s3://test-bucket/data/"), "{e}");
    assert!(objects.next().is_none(), "the iterator ends at its first error");
    server.inject([Fault::Status(403)]);
    let e = data.list_dir("").unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::AccessDenied, .. }), "{e:?}");
    assert!(e.to_string().contains("may list this bucket"), "{e}");
}

#[test]
fn a_key_the_client_cannot_name_is_named_in_the_listings_error() {
    // S3 takes `a//b` and `./x`; object_store's paths refuse them, and with them the page
    // that holds them. The error names the key and says what to do, once, without retries.
    for key in ["odd/a//b.bin", "odd/./x.bin"] {
        let server = server();
        server.put(&format!("/test-bucket/{key}"), vec![1, 2, 3]);
        let odd = RemotePrefix::open_with("s3://test-bucket/odd/", &options(&server)).unwrap();
        let e = odd.list("").unwrap().next().unwrap().unwrap_err();
        assert!(
            matches!(e, Error::Remote { kind: RemoteErrorKind::UnsupportedKey, attempts: 1, .. }),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(text.contains(key) && text.contains("rename that object"), "{text}");
        assert!(!text.contains("endpoint"), "{text}");
        assert_eq!(server.lists(), 1);
        // Other prefixes list as before.
        let data = RemotePrefix::open_with("s3://test-bucket/data/", &options(&server)).unwrap();
        assert_eq!(listed(&data, "").len(), 4);
    }
}

#[test]
fn named_objects_are_sized_read_and_written_through_the_prefix() {
    let server = server();
    let data = RemotePrefix::open_with("s3://test-bucket/data/", &options(&server)).unwrap();
    assert_eq!(data.len_of("sub/b.bin").unwrap(), Some(5));
    assert_eq!(data.len_of("missing.bin").unwrap(), None);
    let file = data.open_file("sub/c/d.bin", None).unwrap();
    let mut seven = [0u8; 7];
    file.read(&mut seven, 0).unwrap();
    assert_eq!(seven.to_vec(), common::random_bytes(7, 7));
    let e = data.open_file("missing.bin", None).unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::NotFound, .. }), "{e:?}");
    // A known length skips the HEAD.
    let heads = server.heads();
    assert_eq!(data.open_file("a.bin", Some(3)).unwrap().len(), 3);
    assert_eq!(server.heads(), heads);

    let bytes = common::random_bytes(100_003, 9);
    let writer = data.create_file("new/obj.bin", None).unwrap();
    writer.pwrite(&bytes[1000..], 1000).unwrap();
    writer.pwrite(&bytes[..1000], 0).unwrap();
    assert_eq!(writer.finish().unwrap(), bytes.len() as u64);
    assert_eq!(server.object("/test-bucket/data/new/obj.bin").unwrap(), bytes);
    assert_eq!(data.len_of("new/obj.bin").unwrap(), Some(bytes.len() as u64));
    assert!(data.list_dir("").unwrap().dirs.contains(&"new".to_owned()));
}

#[test]
fn deletes_remove_the_named_objects_alone_in_batches() {
    let server = server();
    let data = RemotePrefix::open_with("s3://test-bucket/data/", &options(&server)).unwrap();
    data.delete(&["a.bin", "sub/c/d.bin", "never-there.bin"]).unwrap();
    assert_eq!(listed(&data, ""), vec![entry("sub/b.bin", 5), entry("z.json", 11)]);
    // More than one request's worth (S3 takes 1000 keys a request).
    let names: Vec<String> = (0..2500).map(|i| format!("many/{i:05}")).collect();
    for name in &names {
        server.put(&format!("/test-bucket/data/{name}"), vec![1]);
    }
    assert_eq!(listed(&data, "many").len(), 2500);
    data.delete(&names).unwrap();
    assert!(listed(&data, "many").is_empty());
    assert!(server.object("/test-bucket/datax/e.bin").is_some());
    assert!(server.object("/test-bucket/data/z.json").is_some());
}

#[test]
fn names_that_could_leave_the_prefix_are_refused_before_any_request() {
    let server = server();
    let data = RemotePrefix::open_with("s3://test-bucket/data/", &options(&server)).unwrap();
    for name in ["", "../datax/e.bin", "a//b", "./a.bin", "sub/../../other/f.bin", "x\r\ny"] {
        for outcome in [
            data.len_of(name).map(drop),
            data.open_file(name, None).map(drop),
            data.create_file(name, None).map(drop),
            data.delete(&[name, "z.json"]),
        ] {
            let e = outcome.unwrap_err();
            assert!(
                matches!(e, Error::Remote { kind: RemoteErrorKind::InvalidUrl, .. }),
                "{name:?}: {e:?}"
            );
        }
    }
    assert!(data.list("../datax").is_err() && data.list_dir("a//b").is_err());
    assert_eq!((server.lists(), server.heads()), (0, 0));
    assert_eq!(server.paths().len(), LAYOUT.len(), "nothing was deleted");
    for url in ["s3://Bad/", "https://host/dir/", "s3://test-bucket/a//b/", "s3://test-bucket/x?y"]
    {
        let e = RemotePrefix::open_with(url, &options(&server)).unwrap_err();
        assert!(
            matches!(e, Error::Remote { kind: RemoteErrorKind::InvalidUrl, .. }),
            "{url}: {e:?}"
        );
    }
}

#[test]
fn folder_markers_are_not_listed_as_objects() {
    // Consoles make an empty object `sub/` for a folder. object_store's paths drop the last
    // `/`, so it would list as an empty object `sub` beside the folder's own keys.
    let server = server();
    server.put("/test-bucket/data/", vec![]);
    server.put("/test-bucket/data/sub/", vec![]);
    server.put("/test-bucket/data/sub/c/", vec![]);
    server.put("/test-bucket/data/empty.txt", vec![]);
    let data = RemotePrefix::open_with("s3://test-bucket/data/", &options(&server)).unwrap();
    assert_eq!(
        listed(&data, ""),
        vec![
            entry("a.bin", 3),
            entry("empty.txt", 0),
            entry("sub/b.bin", 5),
            entry("sub/c/d.bin", 7),
            entry("z.json", 11)
        ]
    );
    // A level's listing holds neither its own marker nor its folders' markers.
    let level = data.list_dir("sub").unwrap();
    assert_eq!(level.objects, vec![entry("sub/b.bin", 5)]);
    assert_eq!(level.dirs, vec!["sub/c".to_owned()]);
    // Pages that end between a marker and its first key lose nothing.
    server.list_page_size(1);
    assert_eq!(listed(&data, "").len(), 5);
}

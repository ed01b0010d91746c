//! The data `gpumap write` generates and `gpumap read --verify` can check: a pure function of
//! the file offset, so any range of a written file can be checked on its own.

/// The byte at file offset `offset`: splitmix64 of the 8-byte word index, little-endian.
fn word(index: u64) -> u64 {
    let mut z = index.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn byte(at: u64) -> u8 {
    word(at / 8).to_le_bytes()[(at % 8) as usize]
}

/// Fills `buf` with the pattern bytes of `[offset, offset + buf.len())`, in parallel.
pub fn fill(buf: &mut [u8], offset: u64) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 20;
    buf.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(i, chunk)| fill_serial(chunk, offset + (i * CHUNK) as u64));
}

fn fill_serial(buf: &mut [u8], offset: u64) {
    let head = (((8 - offset % 8) % 8) as usize).min(buf.len());
    let (head_bytes, rest) = buf.split_at_mut(head);
    for (i, b) in head_bytes.iter_mut().enumerate() {
        *b = byte(offset + i as u64);
    }
    let first_word = (offset + head as u64) / 8;
    let whole = rest.len() / 8 * 8;
    let (words, tail) = rest.split_at_mut(whole);
    for (i, w) in words.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(first_word + i as u64).to_le_bytes());
    }
    let tail_offset = offset + (head + whole) as u64;
    for (i, b) in tail.iter_mut().enumerate() {
        *b = byte(tail_offset + i as u64);
    }
}

/// The first offset in `[offset, offset + buf.len())` whose byte differs from the pattern.
pub fn first_mismatch(buf: &[u8], offset: u64) -> Option<u64> {
    const CHUNK: usize = 1 << 20;
    let mut expected = vec![0u8; CHUNK.min(buf.len())];
    buf.chunks(CHUNK).enumerate().find_map(|(i, chunk)| {
        let at = offset + (i * CHUNK) as u64;
        fill_serial(&mut expected[..chunk.len()], at);
        chunk.iter().zip(&expected).position(|(a, b)| a != b).map(|p| at + p as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_window_matches_the_bytewise_definition() {
        for offset in [0u64, 1, 7, 8, 4095, 1 << 33] {
            let mut buf = vec![0u8; 3 * (1 << 20) + 13];
            fill(&mut buf, offset);
            for (i, b) in buf.iter().enumerate().step_by(997) {
                assert_eq!(*b, byte(offset + i as u64));
            }
            assert_eq!(first_mismatch(&buf, offset), None);
            buf[2_000_001] ^= 1;
            assert_eq!(first_mismatch(&buf, offset), Some(offset + 2_000_001));
        }
    }
}

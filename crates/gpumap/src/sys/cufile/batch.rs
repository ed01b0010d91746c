//! cuFile's batch API (`cuFileBatchIOSetUp/Submit/GetStatus/Destroy`): many reads in one
//! submission, each with its own result.

use super::*;

/// One read of a batch: `len` bytes at `file_offset` into `base + base_offset`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchEntry {
    /// Device address the offsets are relative to.
    pub(crate) base: u64,
    /// Offset into `base`.
    pub(crate) base_offset: usize,
    /// Bytes.
    pub(crate) len: usize,
    /// File offset.
    pub(crate) file_offset: u64,
}

/// Largest batch when the driver does not say (cuFile's default `max_batch_io_size`).
const DEFAULT_MAX_BATCH: usize = 128;
/// How long one batch may make no progress before it is cancelled and reported.
const BATCH_STALL_LIMIT: Duration = Duration::from_secs(300);

/// Held across one [`read_batch`]: one batch of the process in flight at a time. cuFile in its
/// own compatibility mode (no nvidia-fs) made no progress at all once two threads each had a
/// batch in flight (decision 0027), and its documentation promises nothing about batches from
/// several threads. Only cuFile's own calls run under it.
static ONE_BATCH_AT_A_TIME: crate::sync::Mutex<()> = crate::sync::Mutex::new(());

/// A batch id (`cuFileBatchIOSetUp`), destroyed on drop.
struct Batch {
    handle: BatchHandle,
    destroy: unsafe extern "C" fn(BatchHandle),
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: the id came from cuFileBatchIOSetUp and is destroyed once; every submitted
        // I/O completed or was cancelled first.
        unsafe { (self.destroy)(self.handle) };
    }
}

/// Reads `entries` with the batch API (`cuFileBatchIOSetUp/Submit/GetStatus/Destroy`), at most
/// the driver's batch size at a time, and returns one result per entry in order.
pub(crate) fn read_batch(
    reg: &FileRegistration,
    entries: &[BatchEntry],
) -> Result<Vec<Result<usize>>> {
    let driver = driver()?;
    let api = &driver.library.api;
    let setup = optional(&api.cuFileBatchIOSetUp)?;
    let submit = optional(&api.cuFileBatchIOSubmit)?;
    let get_status = optional(&api.cuFileBatchIOGetStatus)?;
    let destroy = optional(&api.cuFileBatchIODestroy)?;
    let max = driver
        .props
        .map(|p| p.max_batch_io_size as usize)
        .filter(|&m| m > 0)
        .unwrap_or(DEFAULT_MAX_BATCH);
    let mut results: Vec<Result<usize>> = Vec::with_capacity(entries.len());
    let _one_batch = ONE_BATCH_AT_A_TIME.lock();
    for chunk in entries.chunks(max) {
        let mut params = Vec::with_capacity(chunk.len());
        for (i, e) in chunk.iter().enumerate() {
            let file_offset = to_off(e.file_offset, e.len as u64)?;
            let dev_offset = to_off(e.base_offset as u64, e.len as u64)?;
            params.push(cf::CUfileIOParams_t {
                mode: cf::CUfileBatchMode_t::CUFILE_BATCH,
                u: cf::CUfileIOParams__bindgen_ty_1 {
                    batch: cf::CUfileIOParams__bindgen_ty_1__bindgen_ty_1 {
                        devPtr_base: e.base as *mut c_void,
                        file_offset,
                        devPtr_offset: dev_offset,
                        size: e.len,
                    },
                },
                fh: reg.handle,
                opcode: cf::CUfileOpcode_t::CUFILE_READ,
                // The index comes back in the completion event to place its result.
                cookie: i as *mut c_void,
            });
        }
        let n = chunk.len() as c_uint;
        let mut handle: BatchHandle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer.
        check("cuFileBatchIOSetUp", unsafe { setup(&mut handle, n) }, Some(&reg.path), None)?;
        let batch = Batch { handle, destroy };
        // SAFETY: `params` holds `n` initialised entries and lives until every I/O completed
        // (it is leaked on the paths where that cannot be confirmed).
        let st = unsafe { submit(batch.handle, n, params.as_mut_ptr(), 0) };
        check("cuFileBatchIOSubmit", st, Some(&reg.path), None)?;
        let mut chunk_results: Vec<Option<Result<usize>>> =
            (0..chunk.len()).map(|_| None).collect();
        let mut done = 0usize;
        let mut events =
            vec![IoEvent { cookie: std::ptr::null_mut(), status: 0, ret: 0 }; chunk.len()];
        let mut last_progress = Instant::now();
        while done < chunk.len() {
            let remaining = (chunk.len() - done) as c_uint;
            let mut nr = remaining;
            let mut timeout = libc::timespec { tv_sec: 1, tv_nsec: 0 };
            // SAFETY: `events` has room for `remaining` (<= its length) entries, `nr` and
            // `timeout` are valid for the call.
            let st = unsafe {
                get_status(batch.handle, remaining, &mut nr, events.as_mut_ptr(), &mut timeout)
            };
            let stalled = last_progress.elapsed() > BATCH_STALL_LIMIT;
            if st.err != CU_FILE_SUCCESS || stalled {
                let cancelled = api
                    .cuFileBatchIOCancel
                    .as_ref()
                    // SAFETY: cancels the live batch's outstanding I/O.
                    .map(|cancel| unsafe { cancel(batch.handle) }.err == CU_FILE_SUCCESS)
                    .unwrap_or(false);
                if !cancelled {
                    // The library may still read the parameters (and write the device): keep
                    // the memory and the batch id alive forever rather than free them under it.
                    std::mem::forget(params);
                    std::mem::forget(batch);
                }
                if stalled && st.err == CU_FILE_SUCCESS {
                    return Err(Error::CuFile {
                        op: "cuFileBatchIOGetStatus",
                        code: 0,
                        name: format!("no progress for {}s", BATCH_STALL_LIMIT.as_secs()),
                        path: Some(reg.path.clone()),
                        offset: None,
                    });
                }
                return Err(status_error("cuFileBatchIOGetStatus", st, Some(&reg.path), None));
            }
            let reported = (nr as usize).min(events.len());
            for ev in &events[..reported] {
                let index = ev.cookie as usize;
                if ev.status == CUFILE_WAITING || ev.status == CUFILE_PENDING {
                    continue;
                }
                let Some(slot) = chunk_results.get_mut(index) else { continue };
                if slot.is_some() {
                    continue;
                }
                let entry = chunk[index];
                *slot = Some(if ev.status == CUFILE_COMPLETE {
                    Ok(ev.ret)
                } else {
                    // `ret` carries a negated CUfileOpError for failed entries when it has one.
                    let signed = ev.ret as isize;
                    let code = if signed < 0 { -(signed as i64) } else { i64::from(ev.status) };
                    Err(Error::CuFile {
                        op: "cuFileBatchIO read",
                        code,
                        name: if signed < 0 {
                            op_error_name(code).to_owned()
                        } else {
                            format!("batch entry status {}", ev.status)
                        },
                        path: Some(reg.path.clone()),
                        offset: Some(entry.file_offset),
                    })
                });
                done += 1;
                last_progress = Instant::now();
            }
        }
        drop(batch);
        drop(params);
        results.extend(chunk_results.into_iter().map(|r| {
            r.unwrap_or_else(|| Err(Error::InvalidArgument("batch entry lost".to_owned())))
        }));
    }
    Ok(results)
}

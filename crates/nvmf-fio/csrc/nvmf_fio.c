/*
 * nvmf_fio.c - the C side of the nvmf fio engine: fio's `struct ioengine_ops`
 * for this fio build, translating fio's thread_data / fio_file / io_u into
 * calls of the Rust C ABI (src/ffi.rs), which does all NVMe/TCP work.
 *
 * Compiled only against a configured fio source tree of the fio that loads
 * the engine (build.rs, FIO_SRC): the structure layouts are that build's.
 * It calls no fio function but log_err (one the fio binary exports); the
 * job's error is set directly in td->error / td->verror.
 *
 * Per fio job (thread or process): `struct nvmf_td` holds the Rust job and
 * the event arrays (iodepth entries, allocated in init). Per fio file: the
 * file's index in the Rust job, +1, in f->engine_data.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fio.h"
#include "optgroup.h"

/* The Rust side (src/ffi.rs). */
int nvmf_fio_probe(const char *name, uint64_t *size, uint32_t *bs, char *msg, size_t msglen);
void *nvmf_fio_job_new(uint32_t depth, uint32_t min_bs, uint32_t max_bs, uint32_t poll_us,
		       char *msg, size_t msglen);
void nvmf_fio_job_free(void *job);
int nvmf_fio_open(void *job, const char *name, char *msg, size_t msglen);
void nvmf_fio_close(void *job, int idx);
int nvmf_fio_queue(void *job, int idx, uint32_t op, uint64_t offset, uint64_t len, void *buf,
		   void *tag, int *err, char *msg, size_t msglen);
int nvmf_fio_commit(void *job, char *msg, size_t msglen);
int nvmf_fio_getevents(void *job, uint32_t min, uint32_t max, int64_t timeout_ns, void **tags,
		       int *errs, char *msg, size_t msglen);

enum { NVMF_OP_READ = 0, NVMF_OP_WRITE = 1, NVMF_OP_TRIM = 2, NVMF_OP_FLUSH = 3 };
enum { NVMF_Q_QUEUED = 0, NVMF_Q_BUSY = 1, NVMF_Q_COMPLETED = 2 };

#define MSG_LEN 512

/* The engine's fio options (td->eo); fio wants the first member to be a pointer. */
struct nvmf_options {
	void *pad;
	unsigned int poll_us;
};

static struct fio_option nvmf_fio_options[] = {
	{
		.name = "nvmf_poll_us",
		.lname = "nvmf busy-poll time",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_options, poll_us),
		.def = "0",
		.minval = 0,
		.maxval = 1000000,
		.help = "Busy-poll the sockets this many microseconds without a completion before "
			"sleeping in poll(2) (0: sleep whenever idle)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = NULL,
	},
};

struct nvmf_td {
	void *job;
	unsigned int depth;
	void **tags;
	int *errs;
	char msg[MSG_LEN];
};

/* What __td_verror does (it is not exported by every fio build). */
static void nvmf_set_error(struct thread_data *td, int err, const char *msg)
{
	struct thread_data *t = td;
	int k;

	for (k = 0; k < 2 && t; k++, t = t->parent) {
		if (t->error)
			continue;
		t->error = err;
		snprintf(t->verror, sizeof(t->verror), "nvmf: %s", msg);
	}
}

static void nvmf_fail(struct thread_data *td, int err, const char *what, const char *msg)
{
	log_err("nvmf: %s: %s\n", what, msg);
	nvmf_set_error(td, err, msg);
}

/* Parent process, before the jobs start: the namespace size is the file size. */
static int nvmf_setup(struct thread_data *td)
{
	struct fio_file *f;
	unsigned int i;
	char msg[MSG_LEN];

	for_each_file(td, f, i) {
		uint64_t size = 0;
		uint32_t bs = 0;

		msg[0] = '\0';
		if (nvmf_fio_probe(f->file_name, &size, &bs, msg, sizeof(msg))) {
			nvmf_fail(td, EINVAL, "setup", msg);
			return 1;
		}
		f->real_file_size = size;
		f->filetype = FIO_TYPE_BLOCK;
		fio_file_set_size_known(f);
	}
	return 0;
}

static int nvmf_init(struct thread_data *td)
{
	struct nvmf_td *d;
	unsigned long long min_bs = td_min_bs(td), max_bs;

	/* The slot buffers carry reads and writes; a trim only sends its range. */
	max_bs = td->o.max_bs[DDIR_READ] > td->o.max_bs[DDIR_WRITE] ? td->o.max_bs[DDIR_READ]
								      : td->o.max_bs[DDIR_WRITE];

	if (max_bs > UINT32_MAX) {
		nvmf_fail(td, EINVAL, "init", "block size above 4 GiB");
		return 1;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return 1;
	d->depth = td->o.iodepth ? td->o.iodepth : 1;
	d->tags = calloc(d->depth, sizeof(*d->tags));
	d->errs = calloc(d->depth, sizeof(*d->errs));
	if (!d->tags || !d->errs)
		goto fail;
	{
		struct nvmf_options *o = td->eo;

		d->job = nvmf_fio_job_new(d->depth, (uint32_t)min_bs, (uint32_t)max_bs,
					  o ? o->poll_us : 0, d->msg, sizeof(d->msg));
	}
	if (!d->job) {
		nvmf_fail(td, EINVAL, "init", d->msg);
		goto fail;
	}
	td->io_ops_data = d;
	return 0;
fail:
	free(d->tags);
	free(d->errs);
	free(d);
	return 1;
}

static void nvmf_cleanup(struct thread_data *td)
{
	struct nvmf_td *d = td->io_ops_data;

	if (!d)
		return;
	nvmf_fio_job_free(d->job);
	free(d->tags);
	free(d->errs);
	free(d);
	td->io_ops_data = NULL;
}

static int nvmf_open_file(struct thread_data *td, struct fio_file *f)
{
	struct nvmf_td *d = td->io_ops_data;
	int idx;

	if (!d)
		return 1;
	idx = nvmf_fio_open(d->job, f->file_name, d->msg, sizeof(d->msg));
	if (idx < 0) {
		nvmf_fail(td, EIO, "open", d->msg);
		return 1;
	}
	FILE_SET_ENG_DATA(f, (void *)(uintptr_t)(idx + 1));
	return 0;
}

static int nvmf_close_file(struct thread_data *td, struct fio_file *f)
{
	struct nvmf_td *d = td->io_ops_data;
	uintptr_t idx = (uintptr_t)FILE_ENG_DATA(f);

	if (d && idx)
		nvmf_fio_close(d->job, (int)(idx - 1));
	FILE_SET_ENG_DATA(f, NULL);
	return 0;
}

static int nvmf_get_file_size(struct thread_data *td, struct fio_file *f)
{
	char msg[MSG_LEN];
	uint64_t size = 0;
	uint32_t bs = 0;

	if (fio_file_size_known(f))
		return 0;
	msg[0] = '\0';
	if (nvmf_fio_probe(f->file_name, &size, &bs, msg, sizeof(msg))) {
		nvmf_fail(td, EINVAL, "file size", msg);
		return 1;
	}
	f->real_file_size = size;
	fio_file_set_size_known(f);
	return 0;
}

static enum fio_q_status nvmf_queue(struct thread_data *td, struct io_u *io_u)
{
	struct nvmf_td *d = td->io_ops_data;
	uintptr_t idx = (uintptr_t)FILE_ENG_DATA(io_u->file);
	uint32_t op;
	int err = 0, r;

	fio_ro_check(td, io_u);
	switch (io_u->ddir) {
	case DDIR_READ:
		op = NVMF_OP_READ;
		break;
	case DDIR_WRITE:
		op = NVMF_OP_WRITE;
		break;
	case DDIR_TRIM:
		op = NVMF_OP_TRIM;
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
	case DDIR_SYNC_FILE_RANGE:
		op = NVMF_OP_FLUSH;
		break;
	default:
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	if (!idx) {
		io_u->error = EBADF;
		return FIO_Q_COMPLETED;
	}
	r = nvmf_fio_queue(d->job, (int)(idx - 1), op, io_u->offset, io_u->xfer_buflen,
			   io_u->xfer_buf, io_u, &err, d->msg, sizeof(d->msg));
	switch (r) {
	case NVMF_Q_QUEUED:
		return FIO_Q_QUEUED;
	case NVMF_Q_BUSY:
		return FIO_Q_BUSY;
	case NVMF_Q_COMPLETED:
		io_u->error = err ? err : EIO;
		return FIO_Q_COMPLETED;
	default:
		log_err("nvmf: queue: %s\n", d->msg);
		io_u->error = EIO;
		return FIO_Q_COMPLETED;
	}
}

static int nvmf_commit(struct thread_data *td)
{
	struct nvmf_td *d = td->io_ops_data;

	if (nvmf_fio_commit(d->job, d->msg, sizeof(d->msg))) {
		log_err("nvmf: commit: %s\n", d->msg);
		return -EIO;
	}
	return 0;
}

static int nvmf_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			  const struct timespec *t)
{
	struct nvmf_td *d = td->io_ops_data;
	int64_t timeout = -1;
	int n, i;

	if (max > d->depth)
		max = d->depth;
	if (t)
		timeout = (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec;
	n = nvmf_fio_getevents(d->job, min, max, timeout, d->tags, d->errs, d->msg,
			       sizeof(d->msg));
	if (n < 0) {
		nvmf_fail(td, EIO, "getevents", d->msg);
		return -EIO;
	}
	for (i = 0; i < n; i++) {
		struct io_u *io_u = d->tags[i];

		io_u->error = d->errs[i];
		io_u->resid = d->errs[i] ? io_u->xfer_buflen : 0;
	}
	return n;
}

static struct io_u *nvmf_event(struct thread_data *td, int event)
{
	struct nvmf_td *d = td->io_ops_data;

	return d->tags[event];
}

static struct ioengine_ops nvmf_ops = {
	.name = "nvmf",
	.version = FIO_IOOPS_VERSION,
	.flags = FIO_RAWIO | FIO_NOEXTEND | FIO_NODISKUTIL | FIO_MEMALIGN | FIO_DISKLESSIO,
	.setup = nvmf_setup,
	.init = nvmf_init,
	.queue = nvmf_queue,
	.commit = nvmf_commit,
	.getevents = nvmf_getevents,
	.event = nvmf_event,
	.cleanup = nvmf_cleanup,
	.open_file = nvmf_open_file,
	.close_file = nvmf_close_file,
	.get_file_size = nvmf_get_file_size,
	.options = nvmf_fio_options,
	.option_struct_size = sizeof(struct nvmf_options),
};

/* Called by get_ioengine (src/ffi.rs), which fio looks up. */
struct ioengine_ops *nvmf_fio_shim_ops(void)
{
	return &nvmf_ops;
}

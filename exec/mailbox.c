#include "exec/mailbox.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* A message between two devices of this process; data is 16-byte aligned. */
typedef struct message {
    struct message *next;
    size_t bytes;
    unsigned char data[]; /* 16-byte aligned: malloc, after a 16-byte header */
} message;

struct ps_mailbox {
    int n_devices;
    ps_hosts *hosts; /* borrowed; NULL: every device is here */
    pthread_mutex_t mu;
    /* [dst]: a message for dst, or the abort. One per receiver, so that a
     * post wakes only the device it is for: on a host with fewer cores than
     * devices every needless wake-up costs a scheduler time slice. */
    pthread_cond_t *cv;
    bool aborted;
    message **head, **tail; /* [(src * n + dst) * PS_HOSTS_CHANNELS + channel] */
};

static size_t queue_of(const ps_mailbox *mb, int src, int dst, int channel)
{
    return ((size_t)src * (size_t)mb->n_devices + (size_t)dst) * PS_HOSTS_CHANNELS +
           (size_t)channel;
}

ps_status ps_mailbox_create(int n_devices, ps_hosts *hosts, ps_mailbox **out, ps_error *err)
{
    *out = NULL;
    if (n_devices < 1)
        return ps_error_set(err, PS_ERR_INVALID, "a mailbox of %d devices", n_devices);
    ps_mailbox *mb = calloc(1, sizeof *mb);
    if (mb == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    size_t queues = (size_t)n_devices * (size_t)n_devices * PS_HOSTS_CHANNELS;
    mb->n_devices = n_devices;
    mb->hosts = hosts != NULL && ps_hosts_count(hosts) > 1 ? hosts : NULL;
    mb->head = calloc(queues, sizeof *mb->head);
    mb->tail = calloc(queues, sizeof *mb->tail);
    mb->cv = calloc((size_t)n_devices, sizeof *mb->cv);
    pthread_mutex_init(&mb->mu, NULL);
    for (int d = 0; mb->cv != NULL && d < n_devices; d++)
        pthread_cond_init(&mb->cv[d], NULL);
    if (mb->head == NULL || mb->tail == NULL || mb->cv == NULL) {
        ps_mailbox_destroy(mb);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    *out = mb;
    return PS_OK;
}

void ps_mailbox_destroy(ps_mailbox *mb)
{
    if (mb == NULL)
        return;
    size_t queues = (size_t)mb->n_devices * (size_t)mb->n_devices * PS_HOSTS_CHANNELS;
    for (size_t q = 0; mb->head != NULL && q < queues; q++)
        for (message *m = mb->head[q]; m != NULL;) {
            message *next = m->next;
            free(m);
            m = next;
        }
    free(mb->head);
    free(mb->tail);
    pthread_mutex_destroy(&mb->mu);
    for (int d = 0; mb->cv != NULL && d < mb->n_devices; d++)
        pthread_cond_destroy(&mb->cv[d]);
    free(mb->cv);
    free(mb);
}

bool ps_mailbox_is_remote(const ps_mailbox *mb, int device)
{
    return mb->hosts != NULL && !ps_hosts_is_local(mb->hosts, device);
}

void *ps_mailbox_payload(size_t bytes)
{
    message *m = malloc(sizeof *m + (bytes > 0 ? bytes : 1));
    if (m == NULL)
        return NULL;
    m->next = NULL;
    m->bytes = bytes;
    return m->data;
}

static message *message_of(void *payload)
{
    return (message *)((char *)payload - offsetof(message, data));
}

void ps_mailbox_discard(void *payload)
{
    if (payload != NULL)
        free(message_of(payload));
}

static ps_status bad_pair(const ps_mailbox *mb, int src, int dst, int channel, ps_error *err)
{
    return ps_error_set(err, PS_ERR_INTERNAL,
                        "a message from device %d to device %d on channel %d (%d devices)", src,
                        dst, channel, mb->n_devices);
}

static bool pair_ok(const ps_mailbox *mb, int src, int dst, int channel)
{
    return src >= 0 && src < mb->n_devices && dst >= 0 && dst < mb->n_devices &&
           channel >= 0 && channel < PS_HOSTS_CHANNELS;
}

ps_status ps_mailbox_post(ps_mailbox *mb, int src, int dst, int channel, void *payload,
                          ps_error *err)
{
    message *m = message_of(payload);
    if (!pair_ok(mb, src, dst, channel)) {
        free(m);
        return bad_pair(mb, src, dst, channel, err);
    }
    if (ps_mailbox_is_remote(mb, dst)) /* the payload travels; freed once sent */
        return ps_hosts_send(mb->hosts, src, dst, channel, m->data, m->bytes, m, err);
    size_t q = queue_of(mb, src, dst, channel);
    pthread_mutex_lock(&mb->mu);
    if (mb->tail[q] != NULL)
        mb->tail[q]->next = m;
    else
        mb->head[q] = m;
    mb->tail[q] = m;
    pthread_cond_broadcast(&mb->cv[dst]);
    pthread_mutex_unlock(&mb->mu);
    return PS_OK;
}

bool ps_mailbox_aborted(ps_mailbox *mb)
{
    pthread_mutex_lock(&mb->mu);
    bool a = mb->aborted;
    pthread_mutex_unlock(&mb->mu);
    return a;
}

static bool stop_if_aborted(void *arg) { return ps_mailbox_aborted(arg); }

ps_status ps_mailbox_take(ps_mailbox *mb, int src, int dst, int channel, void **payload,
                          size_t *bytes, void **owner, ps_error *err)
{
    *payload = *owner = NULL;
    *bytes = 0;
    if (!pair_ok(mb, src, dst, channel))
        return bad_pair(mb, src, dst, channel, err);
    if (ps_mailbox_is_remote(mb, src)) {
        PS_TRY_RET(ps_hosts_recv(mb->hosts, src, dst, channel, stop_if_aborted, mb, payload,
                                 bytes, err));
        *owner = *payload;
        return PS_OK;
    }
    size_t q = queue_of(mb, src, dst, channel);
    pthread_mutex_lock(&mb->mu);
    while (mb->head[q] == NULL && !mb->aborted)
        pthread_cond_wait(&mb->cv[dst], &mb->mu);
    message *m = mb->aborted ? NULL : mb->head[q];
    if (m != NULL) {
        mb->head[q] = m->next;
        if (mb->head[q] == NULL)
            mb->tail[q] = NULL;
    }
    pthread_mutex_unlock(&mb->mu);
    if (m == NULL)
        return ps_error_set(err, PS_ERR_DEVICE,
                            "device %d: stopped because another device failed", dst);
    *payload = m->data;
    *bytes = m->bytes;
    *owner = m;
    return PS_OK;
}

void ps_mailbox_abort(ps_mailbox *mb)
{
    pthread_mutex_lock(&mb->mu);
    mb->aborted = true;
    for (int d = 0; d < mb->n_devices; d++)
        pthread_cond_broadcast(&mb->cv[d]);
    pthread_mutex_unlock(&mb->mu);
}

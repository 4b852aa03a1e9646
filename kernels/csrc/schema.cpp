// The one schema of the torch.ops.torchrec_ascend library. Kernels register per dispatch key elsewhere (cpu/ now,
// PrivateUse1 for Ascend NPU later); a behaviour change gets a new op name, never a flag on an existing one.
// tests/native/test_op_registration.py pins every string below.
#include <torch/library.h>

TORCH_LIBRARY(torchrec_ascend, m) {
  // ID map state: buckets int64[num_buckets, 2] (key, slot) with num_buckets a power of two, free_slots
  // int64[capacity] (a stack), counters int64[2] (next_fresh, num_free).
  m.def(
      "id_map_insert_or_lookup(Tensor(a!) buckets, Tensor free_slots, Tensor(b!) counters, Tensor ids)"
      " -> (Tensor slots, Tensor is_new)");
  // The same insert, also stamping `step` into last_used int64[capacity] (a slot table's) at every mapped slot, with
  // the positions of the IDs it inserted and the count of IDs held before the call (an int64 scalar).
  m.def(
      "id_map_insert_stamped(Tensor(a!) buckets, Tensor free_slots, Tensor(b!) counters, Tensor(c!) last_used,"
      " Tensor ids, int step) -> (Tensor slots, Tensor new_positions, Tensor hits)");
  m.def("id_map_lookup(Tensor buckets, Tensor ids) -> Tensor");
  m.def("id_map_remove(Tensor(a!) buckets, Tensor(b!) free_slots, Tensor(c!) counters, Tensor ids) -> Tensor");
  m.def("id_map_export(Tensor buckets, Tensor counters) -> (Tensor ids, Tensor slots)");
  m.def(
      "id_map_rebuild(Tensor(a!) buckets, Tensor(b!) free_slots, Tensor(c!) counters, Tensor ids, Tensor slots)"
      " -> ()");
  // KEY_VALUE key indexes (torchrec_ascend/kernels/key_value/key_index.py): buckets [partitions * stride] (int32
  // bits of uint32 slot + 1 for key_index_*, int64 bits of uint64 fingerprint | location + 1 for fingerprint_*;
  // 0 empty, all ones a tombstone), sizes/live/used int64[partitions]. Inserts return an int64 scalar: -1, or the
  // partition that would outgrow its stride, or (key_index_insert) -2 - i where key i is present or repeats (nothing
  // indexed then).
  m.def("key_index_lookup(Tensor buckets, Tensor sizes, Tensor key_column, Tensor keys) -> Tensor");
  m.def(
      "key_index_insert(Tensor(a!) buckets, Tensor(b!) sizes, Tensor(c!) live, Tensor(d!) used, Tensor key_column,"
      " Tensor slots, float max_load, float low_load) -> Tensor");
  // The host store's put and pop, with its slot state: free_slots int32[max_slots] (a stack), counts int64[3] (free,
  // handed out, most free), stamps int32[>= max_slots] (per-slot LRU stamps; may be empty for pop). Upsert returns the
  // slots and positions of each distinct key's last occurrence and the insert's int64 scalar (nothing changed unless
  // -1); pop returns the slot of every key (-1 absent) and the slots it freed.
  m.def(
      "key_index_upsert(Tensor(a!) buckets, Tensor(b!) sizes, Tensor(c!) live, Tensor(d!) used,"
      " Tensor(e!) key_column, Tensor free_slots, Tensor(f!) counts, Tensor(g!) stamps, Tensor keys, int stamp,"
      " float max_load, float low_load) -> (Tensor slots, Tensor positions, Tensor full)");
  m.def(
      "key_index_pop(Tensor(a!) buckets, Tensor sizes, Tensor(b!) live, Tensor key_column, Tensor(c!) free_slots,"
      " Tensor(d!) counts, Tensor(e!) stamps, Tensor keys, int free_stamp) -> (Tensor slots, Tensor freed)");
  m.def(
      "fingerprint_find(Tensor buckets, Tensor sizes, Tensor part, Tensor fingerprints, Tensor after,"
      " int fingerprint_bits) -> Tensor");
  m.def(
      "fingerprint_insert(Tensor(a!) buckets, Tensor(b!) sizes, Tensor(c!) live, Tensor(d!) used, Tensor part,"
      " Tensor entries, int fingerprint_bits, float max_load, float low_load) -> Tensor");
  // KEY_VALUE disk tier: record i is record_bytes bytes at offsets[i] * record_bytes of file descriptor fds[i], copied
  // into row i of out; returns int64[2] (-1, 0), or (i, errno) for the first record not read in full (0: end of file).
  m.def("read_records(Tensor fds, Tensor offsets, int record_bytes, Tensor(a!) out) -> Tensor");
  m.def("hash_unique(Tensor ids) -> (Tensor unique, Tensor inverse, Tensor counts)");
  m.def("hash_rank(Tensor ids, int world_size) -> Tensor");
  m.def(
      "hash_bucketize(Tensor lengths, Tensor values, Tensor? weights, int world_size)"
      " -> (Tensor new_lengths, Tensor new_values, Tensor? new_weights, Tensor unbucketize_permute)");
  m.def("hash_uniform_init(Tensor ids, int seed, int dim, float low, float high) -> Tensor");
  // Eviction policies: positions of the `num` candidates with the lowest scores (int64 or float64), ties to the
  // lowest positions.
  m.def("select_lowest(Tensor scores, Tensor candidates, int num) -> Tensor");
  // The same on the scores (high, low) pack into (high saturated into [0, 2**31 - 1], low into [0, 2**32 - 1], as
  // the policies pack them), without building them.
  m.def("select_lowest_packed(Tensor high, Tensor low, Tensor candidates, int num) -> Tensor");
  // Clears free[s] for each of `slots` in turn; a bool scalar: whether each was in range and still set (distinct,
  // all free). Stops at the first that was not.
  m.def("take_slots(Tensor(a!) free, Tensor slots) -> Tensor");
}

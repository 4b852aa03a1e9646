// Declarations of the CPU kernels behind the torch.ops.torchrec_ascend schema (schema.cpp) and the input checks they
// share. A kernel for another dispatch key (PrivateUse1 for Ascend NPU) implements the same signatures in its own
// folder and registers them in its own TORCH_LIBRARY_IMPL block.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace torchrec_ascend {

// ---- ID map: state = buckets int64[num_buckets, 2] (key, slot), free_slots int64[capacity], counters int64[2]
// (next_fresh, num_free). See kernels/id_map.py for the contract.
std::tuple<at::Tensor, at::Tensor> id_map_insert_or_lookup_cpu(
    const at::Tensor& buckets, const at::Tensor& free_slots, const at::Tensor& counters, const at::Tensor& ids);
std::tuple<at::Tensor, at::Tensor, at::Tensor> id_map_insert_stamped_cpu(
    const at::Tensor& buckets,
    const at::Tensor& free_slots,
    const at::Tensor& counters,
    const at::Tensor& last_used,
    const at::Tensor& ids,
    int64_t step);
at::Tensor id_map_lookup_cpu(const at::Tensor& buckets, const at::Tensor& ids);
at::Tensor id_map_remove_cpu(
    const at::Tensor& buckets, const at::Tensor& free_slots, const at::Tensor& counters, const at::Tensor& ids);
std::tuple<at::Tensor, at::Tensor> id_map_export_cpu(const at::Tensor& buckets, const at::Tensor& counters);
void id_map_rebuild_cpu(
    const at::Tensor& buckets,
    const at::Tensor& free_slots,
    const at::Tensor& counters,
    const at::Tensor& ids,
    const at::Tensor& slots);

// ---- hash ops on ID batches
std::tuple<at::Tensor, at::Tensor, at::Tensor> hash_unique_cpu(const at::Tensor& ids);
at::Tensor hash_rank_cpu(const at::Tensor& ids, int64_t world_size);
std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>, at::Tensor> hash_bucketize_cpu(
    const at::Tensor& lengths, const at::Tensor& values, const std::optional<at::Tensor>& weights, int64_t world_size);
at::Tensor hash_uniform_init_cpu(const at::Tensor& ids, int64_t seed, int64_t dim, double low, double high);

// ---- eviction policies (cpu/select_lowest.cpp)
at::Tensor select_lowest_cpu(const at::Tensor& scores, const at::Tensor& candidates, int64_t num);
at::Tensor select_lowest_packed_cpu(
    const at::Tensor& high, const at::Tensor& low, const at::Tensor& candidates, int64_t num);
at::Tensor take_slots_cpu(const at::Tensor& free, const at::Tensor& slots);  // (cpu/take_slots.cpp)

// ---- KEY_VALUE key indexes (cpu/key_index.cpp, cpu/open_table.h): partitioned open-addressing buckets owned by
// torchrec_ascend/kernels/key_value/key_index.py. The insert ops return an int64 scalar: -1, or the partition that would
// outgrow its reserved buckets, or (key_index_insert) -2 - i where key i is present or repeats (nothing indexed).
at::Tensor key_index_lookup_cpu(
    const at::Tensor& buckets, const at::Tensor& sizes, const at::Tensor& key_column, const at::Tensor& keys);
at::Tensor key_index_insert_cpu(
    const at::Tensor& buckets,
    const at::Tensor& sizes,
    const at::Tensor& live,
    const at::Tensor& used,
    const at::Tensor& key_column,
    const at::Tensor& slots,
    double max_load,
    double low_load);
std::tuple<at::Tensor, at::Tensor, at::Tensor> key_index_upsert_cpu(
    const at::Tensor& buckets,
    const at::Tensor& sizes,
    const at::Tensor& live,
    const at::Tensor& used,
    const at::Tensor& key_column,
    const at::Tensor& free_slots,
    const at::Tensor& counts,
    const at::Tensor& stamps,
    const at::Tensor& keys,
    int64_t stamp,
    double max_load,
    double low_load);
std::tuple<at::Tensor, at::Tensor> key_index_pop_cpu(
    const at::Tensor& buckets,
    const at::Tensor& sizes,
    const at::Tensor& live,
    const at::Tensor& key_column,
    const at::Tensor& free_slots,
    const at::Tensor& counts,
    const at::Tensor& stamps,
    const at::Tensor& keys,
    int64_t free_stamp);
at::Tensor fingerprint_find_cpu(
    const at::Tensor& buckets,
    const at::Tensor& sizes,
    const at::Tensor& part,
    const at::Tensor& fingerprints,
    const at::Tensor& after,
    int64_t fingerprint_bits);
at::Tensor fingerprint_insert_cpu(
    const at::Tensor& buckets,
    const at::Tensor& sizes,
    const at::Tensor& live,
    const at::Tensor& used,
    const at::Tensor& part,
    const at::Tensor& entries,
    int64_t fingerprint_bits,
    double max_load,
    double low_load);

// ---- reading fixed-size records by offset from open files (cpu/record_io.cpp), for the KEY_VALUE disk tier: record i
// is `record_bytes` bytes at offsets[i] * record_bytes of file descriptor fds[i], copied into row i of `out`. Returns
// int64[2]: (-1, 0) when every record was read, else (i, errno) for the first record i not read in full (errno 0: the
// file ends before it); records after it in file order are not read.
at::Tensor read_records_cpu(
    const at::Tensor& fds, const at::Tensor& offsets, int64_t record_bytes, const at::Tensor& out);

// ---- input checks (messages name the op and the argument, and say how to fix the call)
void check_1d_int64(const at::Tensor& t, const char* op, const char* arg);
void check_non_negative(const at::Tensor& ids, const char* op);
void check_buckets(const at::Tensor& buckets, const char* op);
void check_counters_layout(const at::Tensor& counters, const char* op);
void check_counter_values(const at::Tensor& counters, int64_t capacity, const char* op);
// Layout of a full state: the checks above (but not the counter values), free_slots' and num_buckets > capacity.
void check_id_map_layout(
    const at::Tensor& buckets, const at::Tensor& free_slots, const at::Tensor& counters, const char* op);

}  // namespace torchrec_ascend

// CPU kernels of the torch.ops.torchrec_ascend library (the schema is in ../schema.cpp).
#include <torch/library.h>

#include "../ops.h"

TORCH_LIBRARY_IMPL(torchrec_ascend, CPU, m) {
  m.impl("id_map_insert_or_lookup", &torchrec_ascend::id_map_insert_or_lookup_cpu);
  m.impl("id_map_insert_stamped", &torchrec_ascend::id_map_insert_stamped_cpu);
  m.impl("id_map_lookup", &torchrec_ascend::id_map_lookup_cpu);
  m.impl("id_map_remove", &torchrec_ascend::id_map_remove_cpu);
  m.impl("id_map_export", &torchrec_ascend::id_map_export_cpu);
  m.impl("id_map_rebuild", &torchrec_ascend::id_map_rebuild_cpu);
  m.impl("key_index_lookup", &torchrec_ascend::key_index_lookup_cpu);
  m.impl("key_index_insert", &torchrec_ascend::key_index_insert_cpu);
  m.impl("key_index_upsert", &torchrec_ascend::key_index_upsert_cpu);
  m.impl("key_index_pop", &torchrec_ascend::key_index_pop_cpu);
  m.impl("fingerprint_find", &torchrec_ascend::fingerprint_find_cpu);
  m.impl("fingerprint_insert", &torchrec_ascend::fingerprint_insert_cpu);
  m.impl("read_records", &torchrec_ascend::read_records_cpu);
  m.impl("hash_unique", &torchrec_ascend::hash_unique_cpu);
  m.impl("hash_rank", &torchrec_ascend::hash_rank_cpu);
  m.impl("hash_bucketize", &torchrec_ascend::hash_bucketize_cpu);
  m.impl("hash_uniform_init", &torchrec_ascend::hash_uniform_init_cpu);
  m.impl("select_lowest", &torchrec_ascend::select_lowest_cpu);
  m.impl("select_lowest_packed", &torchrec_ascend::select_lowest_packed_cpu);
  m.impl("take_slots", &torchrec_ascend::take_slots_cpu);
}

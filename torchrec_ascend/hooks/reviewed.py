"""Reviewed digests of every patch target's source, per TorchRec release (data; see
:mod:`torchrec_ascend.injection.drift`). Written by ``python -m torchrec_ascend.injection.drift --record``
after reviewing the targets that changed; never edit a digest by hand."""

REVIEWED = {
    "h1.sharder_sharding_types": {
        "target": "torchrec.distributed.embedding_types:BaseEmbeddingSharder.sharding_types",
        "digests": {
            "1.8.0": "f5b64644f7ab0c14",
            "1.9.2": "47544b7a01d85a5f"
        }
    },
    "h1.sharder_compute_kernels": {
        "target": "torchrec.distributed.embedding_types:BaseEmbeddingSharder.compute_kernels",
        "digests": {
            "1.8.0": "bea12cd6a4e2e3cb",
            "1.9.2": "75c6cf025c5d6e54"
        }
    },
    "h1.fused_sharder_sharding_types": {
        "target": "torchrec.distributed.fused_embeddingbag:FusedEmbeddingBagCollectionSharder.sharding_types",
        "digests": {
            "1.8.0": "da886caccf450599",
            "1.9.2": "da886caccf450599"
        }
    },
    "h1.fused_sharder_compute_kernels": {
        "target": "torchrec.distributed.fused_embeddingbag:FusedEmbeddingBagCollectionSharder.compute_kernels",
        "digests": {
            "1.8.0": "f46dcd13e8b551b5",
            "1.9.2": "f46dcd13e8b551b5"
        }
    },
    "h1.mc_sharder_compute_kernels": {
        "target": "torchrec.distributed.mc_embedding_modules:BaseManagedCollisionEmbeddingCollectionSharder.compute_kernels",
        "digests": {
            "1.8.0": "244747e34373cfb1",
            "1.9.2": "244747e34373cfb1"
        }
    },
    "h1.topology_device_alias": {
        "target": "torchrec.distributed.planner.types:Topology.__init__",
        "digests": {
            "1.8.0": "57fdfd2f3ed69848",
            "1.9.2": "8dd8c3e592f353bc"
        }
    },
    "h1.plan_placement_device": {
        "target": "torchrec.distributed.planner.planners:to_sharding_plan",
        "digests": {
            "1.8.0": "4951c415aad68197",
            "1.9.2": "4951c415aad68197"
        }
    },
    "h1.explicit_plan_placement": {
        "target": "torchrec.distributed.sharding_plan:placement",
        "digests": {
            "1.8.0": "1cb51fbd7773c8ec",
            "1.9.2": "12738232e97c8695"
        }
    },
    "h1.planner_default_device": {
        "target": "torchrec.distributed.planner.planners:get_device_type",
        "digests": {
            "1.8.0": "4a246d5e39cf6141",
            "1.9.2": "8d26e52bc977440d"
        }
    },
    "h1.sharding_plan_default_device": {
        "target": "torchrec.distributed.sharding_plan:get_device_type",
        "digests": {
            "1.8.0": "4a246d5e39cf6141",
            "1.9.2": "8d26e52bc977440d"
        }
    },
    "h2.pooled_kernel_factory": {
        "target": "torchrec.distributed.embedding_lookup:GroupedPooledEmbeddingsLookup._create_embedding_kernel",
        "digests": {
            "1.8.0": "51fcc64545e952e0",
            "1.9.2": "350e619695b2d916"
        }
    },
    "h2.sequence_kernel_factory": {
        "target": "torchrec.distributed.embedding_lookup:GroupedEmbeddingsLookup._create_embedding_kernel",
        "digests": {
            "1.8.0": "7cd0cbaa94a531fe",
            "1.9.2": "79441d1d5ab5cabb"
        }
    },
    "h3.kernel_device_bandwidths": {
        "target": "torchrec.distributed.planner.estimator.types:HardwarePerfConfig.kernel_device_bandwidths",
        "digests": {
            "1.8.0": "db5c5b15682ff9a0",
            "1.9.2": "db5c5b15682ff9a0"
        }
    },
    "h4.streams_TrainPipelineBase": {
        "target": "torchrec.distributed.train_pipeline.train_pipelines:TrainPipelineBase.__init__",
        "digests": {
            "1.8.0": "604a1e6b65f088a6",
            "1.9.2": "604a1e6b65f088a6"
        }
    },
    "h4.streams_TrainPipelineSparseDist": {
        "target": "torchrec.distributed.train_pipeline.train_pipelines:TrainPipelineSparseDist.__init__",
        "digests": {
            "1.8.0": "fe1f5991ce1a140b",
            "1.9.2": "01f6b8a79019751f"
        }
    },
    "h4.streams_TrainPipelineFusedSparseDist": {
        "target": "torchrec.distributed.train_pipeline.train_pipelines:TrainPipelineFusedSparseDist.__init__",
        "digests": {
            "1.8.0": "ef9d189ddd930f45",
            "1.9.2": "ef9d189ddd930f45"
        }
    },
    "h4.streams_PrefetchTrainPipelineSparseDist": {
        "target": "torchrec.distributed.train_pipeline.train_pipelines:PrefetchTrainPipelineSparseDist.__init__",
        "digests": {
            "1.8.0": "4c880ab197d8de3b",
            "1.9.2": "1995b2a23b5d2130"
        }
    },
    "h4.streams_StagedTrainPipeline": {
        "target": "torchrec.distributed.train_pipeline.train_pipelines:StagedTrainPipeline.__init__",
        "digests": {
            "1.8.0": "19c69c5501efb47a",
            "1.9.2": "19c69c5501efb47a"
        }
    },
    "h4.streams_SparseDataDistUtil": {
        "target": "torchrec.distributed.train_pipeline.pipeline_stage:SparseDataDistUtil.__init__",
        "digests": {
            "1.8.0": "1907c33ae8df19ae",
            "1.9.2": "1907c33ae8df19ae"
        }
    },
    "h4.comm_record_stream": {
        "target": "torchrec.distributed.comm_ops:Request._wait_impl",
        "digests": {
            "1.8.0": "7f73ea3a27f08b79",
            "1.9.2": "7f73ea3a27f08b79"
        }
    },
    "h5.model_copy_enter": {
        "target": "torchrec.distributed.utils:sharded_model_copy.__enter__",
        "digests": {
            "1.8.0": "6948b914d2ae15c9",
            "1.9.2": "6948b914d2ae15c9"
        }
    },
    "h5.model_copy_exit": {
        "target": "torchrec.distributed.utils:sharded_model_copy.__exit__",
        "digests": {
            "1.8.0": "530106ca4c7cb0dd",
            "1.9.2": "530106ca4c7cb0dd"
        }
    },
    "hash.ebc_lookups": {
        "target": "torchrec.modules.embedding_modules:EmbeddingBagCollection.__init__",
        "digests": {
            "1.8.0": "63877acbfabb7a52",
            "1.9.2": "63877acbfabb7a52"
        }
    },
    "hash.ec_lookups": {
        "target": "torchrec.modules.embedding_modules:EmbeddingCollection.__init__",
        "digests": {
            "1.8.0": "0181dc55751018e9",
            "1.9.2": "4b2e8bae2fb08984"
        }
    },
    "hash.ebc_table_specs": {
        "target": "torchrec.distributed.embeddingbag:ShardedEmbeddingBagCollection.create_grouped_sharding_infos",
        "digests": {
            "1.8.0": "5b55b53837f001b4",
            "1.9.2": "0c696b6f990f0661"
        }
    },
    "hash.ec_table_specs": {
        "target": "torchrec.distributed.embedding:ShardedEmbeddingCollection.create_grouped_sharding_infos",
        "digests": {
            "1.8.0": "a0c42f4584922375",
            "1.9.2": "aaa08c8f3b3a4e59"
        }
    },
    "hash.ebc_row_wise": {
        "target": "torchrec.distributed.embeddingbag:ShardedEmbeddingBagCollection.create_embedding_bag_sharding",
        "digests": {
            "1.8.0": "a1bb92b09ac8887b",
            "1.9.2": "a1bb92b09ac8887b"
        }
    },
    "hash.ec_row_wise": {
        "target": "torchrec.distributed.embedding:ShardedEmbeddingCollection.create_embedding_sharding",
        "digests": {
            "1.8.0": "1d26e81677b419d4",
            "1.9.2": "1d26e81677b419d4"
        }
    },
    "hash.ec_index_dedup": {
        "target": "torchrec.distributed.embedding:ShardedEmbeddingCollection._dedup_indices",
        "digests": {
            "1.8.0": "4bfd21aad764ebb3",
            "1.9.2": "4bfd21aad764ebb3"
        }
    },
    "hash.ebc_weight_ids": {
        "target": "torchrec.distributed.embeddingbag:ShardedEmbeddingBagCollection._initialize_torch_state",
        "digests": {
            "1.8.0": "f3f30829e3579ef7",
            "1.9.2": "a074973acc901a28"
        }
    },
    "hash.ec_weight_ids": {
        "target": "torchrec.distributed.embedding:ShardedEmbeddingCollection._initialize_torch_state",
        "digests": {
            "1.8.0": "cb17e5b263093cd7",
            "1.9.2": "935cab0cb88b0ec5"
        }
    },
    "hash.ebc_unsharded_copy": {
        "target": "torchrec.distributed.embeddingbag:ShardedEmbeddingBagCollection._pre_load_state_dict_hook",
        "digests": {
            "1.8.0": "dc7a71996e891fab",
            "1.9.2": "dc7a71996e891fab"
        }
    },
    "hash.ec_unsharded_copy": {
        "target": "torchrec.distributed.embedding:ShardedEmbeddingCollection._pre_load_state_dict_hook",
        "digests": {
            "1.8.0": "480431cea5e3c97f",
            "1.9.2": "480431cea5e3c97f"
        }
    },
    "hash.planner_tables": {
        "target": "torchrec.distributed.planner.enumerators:EmbeddingEnumerator.enumerate",
        "digests": {
            "1.8.0": "c1ca3df4855496b3",
            "1.9.2": "7cc7afa250820624"
        }
    },
    "hash.planner_sharding_types": {
        "target": "torchrec.distributed.planner.enumerators:EmbeddingEnumerator._filter_sharding_types",
        "digests": {
            "1.8.0": "2e1bdf7f4ef614a4",
            "1.9.2": "da822ef0409b4364"
        }
    },
    "h5.reduce_scatter_v_backward": {
        "target": "torchrec.distributed.comm_ops:ReduceScatterV_Wait.backward",
        "digests": {
            "1.8.0": "d180cdf60fe6e7e2",
            "1.9.2": "d180cdf60fe6e7e2"
        }
    },
    "h4.prefetch_without_streams": {
        "target": "torchrec.distributed.train_pipeline.train_pipelines:prefetch_embeddings",
        "digests": {
            "1.8.0": "714da62d13ffc430",
            "1.9.2": "714da62d13ffc430"
        }
    },
    "h4.semi_sync_needs_torchrec_streams": {
        "target": "torchrec.distributed.train_pipeline.train_pipelines:TrainPipelineSemiSync.__init__",
        "digests": {
            "1.8.0": "c0aad3fcf8d30fed",
            "1.9.2": "c0aad3fcf8d30fed"
        }
    },
    "h5.empty_sequence_batch": {
        "target": "torchrec.distributed.embedding:construct_jagged_tensors",
        "digests": {
            "1.8.0": "878bc61d072de088",
            "1.9.2": "a7bd032ea8e7feb0"
        }
    },
    "h2.dense_pooled_device": {
        "target": "torchrec.distributed.batched_embedding_kernel:BatchedDenseEmbeddingBag.__init__",
        "digests": {
            "1.8.0": "6e4f57846ca1e759",
            "1.9.2": "6e4f57846ca1e759"
        }
    },
    "h2.dense_sequence_device": {
        "target": "torchrec.distributed.batched_embedding_kernel:BatchedDenseEmbedding.__init__",
        "digests": {
            "1.8.0": "6f943c7f0f79006b",
            "1.9.2": "6f943c7f0f79006b"
        }
    },
    "h3.key_value_storage": {
        "target": "torchrec.distributed.planner.shard_estimators:calculate_shard_storages",
        "digests": {
            "1.8.0": "5caf3031ba435697",
            "1.9.2": "5caf3031ba435697"
        }
    },
    "hash.ebc_fused_prefetch": {
        "target": "torchrec.distributed.embedding_lookup:GroupedPooledEmbeddingsLookup.prefetch",
        "digests": {
            "1.8.0": "3b477c1c6815b8f2",
            "1.9.2": "3b477c1c6815b8f2"
        }
    },
    "hash.ec_fused_prefetch": {
        "target": "torchrec.distributed.embedding_lookup:GroupedEmbeddingsLookup.prefetch",
        "digests": {
            "1.8.0": "2aac4f4d9dd76b3f",
            "1.9.2": "2aac4f4d9dd76b3f"
        }
    }
}

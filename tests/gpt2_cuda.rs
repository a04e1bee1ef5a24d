//! The CUDA check for the GPT policy, for a machine with a GPU (ignored elsewhere):
//! `cargo test --release --test gpt2_cuda -- --ignored`. Greedy tokens on CUDA equal the CPU's
//! (float32), generation runs in bfloat16, and sampling is reproducible on the device.

use std::path::PathBuf;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{generate, GenerationConfig, Gpt2Model};
use torchrl::Generator;

fn load(device: Device) -> (VarStore, Gpt2Model) {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "specs", "gpt2", "tiny_v101"]
        .iter()
        .collect();
    let vs = VarStore::new(device);
    let model = Gpt2Model::from_pretrained(&vs.root(), dir).unwrap();
    (vs, model)
}

#[test]
#[ignore = "needs CUDA: cargo test --release --test gpt2_cuda -- --ignored"]
fn cuda_greedy_tokens_equal_cpu_and_bf16_runs() {
    assert!(tch::Cuda::is_available(), "this check needs a CUDA device");
    let cuda = Device::Cuda(0);
    let (_cpu_vs, cpu) = load(Device::Cpu);
    let (mut gpu_vs, gpu) = load(cuda);
    let prompt = Tensor::from_slice(&[0i64, 5, 6, 7, 8, 9, 10, 11, 0, 0, 12, 13]).view([3, 4]);
    let mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1]).view([3, 4]);
    let cfg = GenerationConfig::new(12).with_pad_token_id(0);
    let a = generate(&cpu, &prompt, Some(&mask), &cfg, &mut Generator::new(0)).unwrap();
    let b = generate(&gpu, &prompt, Some(&mask), &cfg, &mut Generator::new(0)).unwrap();
    assert_eq!(b.sequences.device(), cuda);
    assert!(a.sequences.equal(&b.sequences.to_device(Device::Cpu)));
    // sampling on the device is reproducible
    let s = GenerationConfig::rlhf_sampling(12);
    let x = generate(&gpu, &prompt, Some(&mask), &s, &mut Generator::new(4)).unwrap();
    let y = generate(&gpu, &prompt, Some(&mask), &s, &mut Generator::new(4)).unwrap();
    assert!(x.sequences.equal(&y.sequences));
    gpu_vs.bfloat16();
    let z = generate(&gpu, &prompt, Some(&mask), &cfg, &mut Generator::new(0)).unwrap();
    assert_eq!(z.log_probs.kind(), Kind::Float);
}

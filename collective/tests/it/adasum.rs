//! Adasum over the real TCP mesh (ranks as threads): the result against a float64 reference
//! of Horovod's formula, identical on every rank; a non-power-of-two group and integer dtypes
//! refused on every rank with the mesh still usable.

use kolo_collective::{DType, Error, ReduceOp};

use crate::collectives::with_ranks;

/// Horovod's pairwise formula on whole vectors, in float64.
fn pair(a: &[f64], b: &[f64]) -> Vec<f64> {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let an: f64 = a.iter().map(|x| x * x).sum();
    let bn: f64 = b.iter().map(|x| x * x).sum();
    let ac = if an != 0.0 { 1.0 - dot / an * 0.5 } else { 1.0 };
    let bc = if bn != 0.0 { 1.0 - dot / bn * 0.5 } else { 1.0 };
    a.iter().zip(b).map(|(x, y)| ac * x + bc * y).collect()
}

/// Horovod's test reference: ranks combined in a tree, (0,1), (2,3), then the pairs.
fn tree(mut level: Vec<Vec<f64>>) -> Vec<f64> {
    while level.len() > 1 {
        level = level.chunks(2).map(|p| pair(&p[0], &p[1])).collect();
    }
    level.remove(0)
}

fn input(rank: usize, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| (((rank * 31 + i * 17) % 23) as f64 - 11.0) / 7.0)
        .collect()
}

#[test]
fn adasum_on_4_ranks_matches_the_reference_and_agrees_everywhere() {
    let n = 1001;
    let scale = 0.5;
    let inputs: Vec<Vec<f64>> = (0..4).map(|r| input(r, n)).collect();
    let expected: Vec<f64> = tree(inputs.clone()).iter().map(|x| x * scale).collect();
    let results = with_ranks(4, |rank, comm| {
        let mut buf: Vec<u8> = bytemuck::cast_slice(&inputs[rank]).to_vec();
        comm.allreduce(
            "g",
            &mut buf,
            &[n as i64],
            DType::F64,
            ReduceOp::Adasum,
            1.0,
            scale,
        )
        .unwrap();
        bytemuck::pod_collect_to_vec::<u8, f64>(&buf)
    });
    for (rank, got) in results.iter().enumerate() {
        assert_eq!(got, &results[0], "rank {rank} differs from rank 0");
        for (g, e) in got.iter().zip(&expected) {
            assert!((g - e).abs() < 1e-12, "rank {rank}: {g} vs {e}");
        }
    }
}

#[test]
fn adasum_on_3_ranks_and_on_integers_fails_every_rank_and_the_mesh_stays_usable() {
    let outcomes = with_ranks(3, |_, comm| {
        let mut buf = vec![0u8; 16];
        let three = comm
            .allreduce("g", &mut buf, &[4], DType::F32, ReduceOp::Adasum, 1.0, 1.0)
            .unwrap_err();
        let ints = comm
            .allreduce("i", &mut buf, &[4], DType::I32, ReduceOp::Adasum, 1.0, 1.0)
            .unwrap_err();
        let mut one = 1f32.to_ne_bytes().to_vec();
        comm.allreduce("s", &mut one, &[1], DType::F32, ReduceOp::Sum, 1.0, 1.0)
            .unwrap();
        (three, ints, f32::from_ne_bytes(one.try_into().unwrap()))
    });
    for (three, ints, sum) in outcomes {
        assert!(
            matches!(&three, Error::InvalidArgument(m) if m.contains("non-power of 2") && m.contains("3 ranks")),
            "{three}"
        );
        assert!(
            matches!(&ints, Error::InvalidArgument(m) if m.contains("Adasum") && m.contains("int32")),
            "{ints}"
        );
        assert_eq!(sum, 3.0);
    }
}

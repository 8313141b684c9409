"""The papers' headline numbers on the reproduction page (benchmarks/REPRODUCTION.md): each ladder's
verdicts (`blocklab.scaling`), the claims a `scaling --until-decided` call waited for, rebuilt as its
rounds' last look read them (`blocklab.rounds`), and the same claims on the prose corpus. Above both the
ladder and the rounds, as the page reads what each of them left."""

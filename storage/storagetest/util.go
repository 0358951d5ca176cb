package storagetest

import (
	"errors"
	"math"
)

func isErr(err, target error) bool     { return errors.Is(err, target) }
func asErr(err error, target any) bool { return errors.As(err, target) }
func nan() float64                     { return math.NaN() }
func inf(sign int) float64             { return math.Inf(sign) }
func negZero() float64                 { return math.Copysign(0, -1) }
